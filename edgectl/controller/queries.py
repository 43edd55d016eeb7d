"""Questions the console asks the store about many devices at once, answered by the store's engine.

With 10,000 devices, decoding every row in Python to filter and page costs about half a second;
the store filters, counts and pages in SQL instead and decodes only the page.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from edgectl.controller.records import AuditEntry, DeviceRecord, PackageRef

__all__ = ["AuditPage", "AuditQuery", "DevicePage", "DeviceQuery", "UploadedPackage"]


@dataclass(frozen=True)
class DeviceQuery:
    """Devices to list: selector terms (``edgectl.controller.selector`` meaning), a version, a text, a page.

    A term's key is a device field (``id``, ``target``, ``model``, ``version``, ``status``, ``agent``, ``site``) or a tag key;
    a value ending in ``*`` matches a prefix. ``text`` matches part of the id, target, model or a tag value.
    """

    terms: tuple[tuple[str, str], ...] = ()
    version: int | None = None
    text: str = ""
    limit: int = 100
    offset: int = 0
    decommissioned: bool = False  # list the devices taken out of the fleet instead of its members


@dataclass(frozen=True)
class DevicePage:
    rows: list[DeviceRecord] = field(default_factory=list)
    total: int = 0  # how many devices match, over all pages


@dataclass(frozen=True)
class UploadedPackage:
    """A signed package an operator uploaded (verified, kept by the store), as the packages list shows it."""

    ref: PackageRef
    uploaded: float
    actor: str

    def to_dict(self) -> dict[str, object]:
        return {**self.ref.to_dict(), "uploaded": self.uploaded, "actor": self.actor}


@dataclass(frozen=True)
class AuditQuery:
    """Audit entries to list: each filter given narrows it; ``actor`` and ``action`` ending in ``*`` match a prefix.

    ``since`` and ``until`` bound the entry's time (Unix seconds, ``since <= ts < until``). The page is of the newest
    entries: ``offset`` skips that many of the newest, ``limit`` takes the next ones."""

    actor: str = ""
    action: str = ""
    rollout_id: str = ""
    device_id: str = ""
    since: float | None = None
    until: float | None = None
    limit: int = 200
    offset: int = 0


@dataclass(frozen=True)
class AuditPage:
    entries: list[AuditEntry] = field(default_factory=list)  # oldest first
    total: int = 0  # how many entries match, over all pages
