"""Server-side device groups (``device_groups``, migrations 8, 11 and 14), written once for both engines.

A static group's members are kept as a JSON array of device ids in one column: a group is read and
written whole, and resolved against the devices in Python like every selector.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from edgectl.controller.groups import DeviceGroup, GroupKind

__all__ = ["GroupSql"]

COLUMNS = ("name", "kind", "members", "query", "description", "created_by", "created_at", "updated_at", "protected", "windows")


class GroupSql:
    """Group rows; a back-end supplies ``_execute`` and ``_all``."""

    def _execute(self, sql: str, args: Sequence[Any] = (), at_once: bool = False) -> Any:
        raise NotImplementedError

    def _all(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        raise NotImplementedError

    def add_group(self, group: DeviceGroup) -> bool:
        cursor = self._execute(f"INSERT INTO device_groups({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))}) "
                               "ON CONFLICT(name) DO NOTHING", _values(group))
        return bool(cursor.rowcount == 1)

    def save_group(self, group: DeviceGroup) -> bool:
        updates = ", ".join(f"{c}=?" for c in COLUMNS[1:])
        cursor = self._execute(f"UPDATE device_groups SET {updates} WHERE name=?", (*_values(group)[1:], group.name))
        return bool(cursor.rowcount == 1)

    def group(self, name: str) -> DeviceGroup | None:
        rows = self._all("SELECT * FROM device_groups WHERE name=?", (name,))
        return _group(rows[0]) if rows else None

    def groups(self) -> list[DeviceGroup]:
        return [_group(r) for r in self._all("SELECT * FROM device_groups ORDER BY name")]

    def remove_group(self, name: str) -> bool:
        return bool(self._execute("DELETE FROM device_groups WHERE name=?", (name,)).rowcount == 1)


def _values(group: DeviceGroup) -> tuple[Any, ...]:
    return (group.name, group.kind.value, json.dumps(list(group.members)), group.query, group.description, group.created_by,
            group.created_at, group.updated_at, int(group.protected), json.dumps(list(group.windows)))


def _group(r: Any) -> DeviceGroup:
    return DeviceGroup(r["name"], GroupKind(r["kind"]), tuple(str(m) for m in json.loads(r["members"] or "[]")),
                       r["query"] or "", r["description"] or "", r["created_by"] or "", float(r["created_at"] or 0.0),
                       float(r["updated_at"] or 0.0), bool(r["protected"]),
                       tuple(str(w) for w in json.loads(r["windows"] or "[]")))
