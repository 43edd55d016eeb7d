"""Device selectors: ``group=lobby,target=jetson-orin`` picks devices by field or tag.

Keys are device fields (``id``, ``target``, ``model``, ``version``, ``status``, ``agent``, ``site``) or
tag keys from the devices' config; ``model`` matches a device that serves a model (or pipeline) of that
name among the several it may run, ``version`` one that serves some model at that version, ``agent`` the
agent version of its birth, ``site`` its ``site`` tag (a field so that a stored group query may name it
before any device reports one). A key that is neither is a user error, so a typo never selects nothing (or all)
silently. ``all`` or ``*`` selects every device. A value may end in ``*`` to match a prefix.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from edgecore.errors import UserError

__all__ = ["FIELDS", "Selector", "parse_selector"]

FIELDS = ("id", "target", "model", "version", "status", "agent", "site")


@dataclass(frozen=True)
class Selector:
    terms: tuple[tuple[str, str], ...]

    def matches(self, device: dict[str, Any]) -> bool:
        """``device`` is a registry row (``DeviceRecord.to_dict()`` shape)."""
        return all(any(_match(value, want) for value in _values(device, key)) for key, want in self.terms)

    def check_keys(self, devices: Iterable[dict[str, Any]]) -> None:
        """Refuse keys that are neither a field nor a tag of any known device."""
        tags = {k for d in devices for k in (d.get("tags") or {})}
        unknown = [k for k, _ in self.terms if k not in FIELDS and k not in tags]
        if unknown:
            known = ", ".join([*FIELDS, *sorted(tags)])
            raise UserError(f"selector: unknown key {unknown[0]!r} (known: {known})")

    def __str__(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.terms) or "all"


def parse_selector(text: str) -> Selector:
    """Parse ``k=v[,k=v...]``; ``all``/``*``/empty selects everything."""
    text = text.strip()
    if text in ("", "all", "*"):
        return Selector(())
    terms = []
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise UserError(f"selector: {part.strip()!r} is not KEY=VALUE (example: group=lobby,target=jetson-orin)")
        terms.append((key, value))
    return Selector(tuple(terms))


def _values(device: dict[str, Any], key: str) -> list[str]:
    if key in ("model", "version") and device.get("models") is not None:
        name = "name" if key == "model" else "version"
        return [str(m[name]) for m in device["models"]] or [""]
    return [_value(device, key)]


def _value(device: dict[str, Any], key: str) -> str:
    if key == "id":
        return str(device.get("device_id", ""))
    if key == "agent":
        return str(device.get("agent_version") or "")
    if key in ("target", "model", "status"):
        return str(device.get(key) or "")
    if key == "version":
        return "" if device.get("version") is None else str(device["version"])
    return str((device.get("tags") or {}).get(key, ""))


def _match(value: str, want: str) -> bool:
    if want.endswith("*"):
        return value.startswith(want[:-1])
    return value == want
