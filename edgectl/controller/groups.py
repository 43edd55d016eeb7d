"""Server-side device groups: named sets of devices the operator keeps in the store, not the devices' own tags.

A *static* group lists its members by device id; a *dynamic* group stores a selector
(:mod:`edgectl.controller.selector`: target, tags, model, version, agent version, site) and is
evaluated when it is used. ``group:NAME`` stands for a group wherever a selector is taken. A
rollout resolves its group once, when it is planned, and records the devices it reached: a later
change of the group does not move a running rollout.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from edgecore.errors import UserError
from edgectl.controller.records import DeviceRecord
from edgectl.controller.selector import Selector, parse_selector

__all__ = ["GROUP_PREFIX", "DeviceGroup", "GroupConflict", "GroupInputError", "GroupKind", "check_group_name", "group_name",
           "matching", "resolve_group"]

GROUP_PREFIX = "group:"
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
MAX_MEMBERS = 100_000
MAX_DESCRIPTION = 500


class GroupInputError(UserError):
    """Bad input for a group; ``field`` names what is wrong (the API answers 400 naming it)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class GroupConflict(UserError):
    """The store's groups or rollouts forbid the change now: a name taken, a group a running rollout uses (409)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class GroupKind(str, enum.Enum):
    """How a group names its devices; stored under these values."""

    STATIC = "static"  # an explicit member list
    DYNAMIC = "dynamic"  # a stored selector, evaluated when the group is used

    def __str__(self) -> str:
        return str(self.value)


@dataclass(frozen=True)
class DeviceGroup:
    """One group as the store keeps it. ``members`` is a static group's; ``query`` a dynamic group's selector."""

    name: str
    kind: GroupKind
    members: tuple[str, ...] = ()
    query: str = ""
    description: str = ""
    created_by: str = ""
    created_at: float = 0.0
    updated_at: float = 0.0
    protected: bool = False  # a rollout to it waits for a second operator's approval (edgectl.fleet.approvals)
    windows: tuple[str, ...] = ()  # maintenance windows in its devices' local time (edgecore.windows); none: any time

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind.value, "members": list(self.members),
                "query": self.query if self.kind == GroupKind.DYNAMIC else None, "description": self.description,
                "created_by": self.created_by, "created_at": self.created_at, "updated_at": self.updated_at,
                "protected": self.protected, "windows": list(self.windows)}

    @property
    def selector(self) -> str:
        """How a selector names this group."""
        return GROUP_PREFIX + self.name


def check_group_name(name: str) -> str:
    """The name, or GroupInputError: lower-case letters, digits, '.', '_', '-', 1-63 of them, starting with a letter or digit."""
    if not _NAME.match(name):
        raise GroupInputError("name", f"{name[:80]!r} is not a group name: use 1-63 lower-case letters, digits, '.', '_' "
                                      "or '-', starting with a letter or digit")
    return name


def group_name(selector: str) -> str | None:
    """The group a selector names (``group:NAME``), or None for a ``k=v`` selector; UserError for a bad name."""
    text = selector.strip()
    if not text.startswith(GROUP_PREFIX):
        return None
    name = text[len(GROUP_PREFIX):].strip()
    try:
        return check_group_name(name)
    except GroupInputError:
        raise UserError(f"selector: {name[:80]!r} is not a group name (group:NAME, see `edgectl group list`)") from None


def resolve_group(group: DeviceGroup, records: Sequence[DeviceRecord]) -> list[DeviceRecord]:
    """The devices of ``records`` in the group now: a static group's members that are known, a dynamic group's matches."""
    if group.kind == GroupKind.STATIC:
        members = set(group.members)
        return [r for r in records if r.id in members]
    return matching(parse_selector(group.query), records)


def matching(chosen: Selector, records: Sequence[DeviceRecord]) -> list[DeviceRecord]:
    """The records ``chosen`` selects; UserError for a key that is neither a field nor any record's tag."""
    rows = [r.to_dict() for r in records]
    chosen.check_keys(rows)
    return [record for record, row in zip(records, rows, strict=True) if chosen.matches(row)]
