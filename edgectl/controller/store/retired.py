"""Records taken out: decommissioned devices (migration 10), their deletion, and uploaded packages no rollout uses.

A decommissioned device keeps its row for history (``devices.decommissioned``: when) and is left out
of every question about the fleet (``devices()``, device pages, counts, models). Its reports no longer
change it: the ingest drops them, and no upsert clears the column, so a device that reconnects is
never a fleet member again. ``withdrawn`` is when the controller cleared its retained desired state.
Deleting one leaves its id in ``deleted_devices``: a report under that id registers no device again.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

__all__ = ["DEVICE_TABLES", "RetiredSql"]

# What a deleted device leaves nowhere: its row, what it serves, its history. Rollout rows and the audit log stay:
# they are the history of the rollouts and of the operators' actions.
DEVICE_TABLES = ("device_models", "telemetry_history", "latency", "events")


class RetiredSql:
    """Decommissioning, deleting and package removal; a back-end supplies ``_execute``, ``_all`` and ``batch``."""

    def _execute(self, sql: str, args: Sequence[Any] = (), at_once: bool = False) -> Any:
        raise NotImplementedError

    def _all(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        raise NotImplementedError

    def batch(self) -> AbstractContextManager[None]:
        raise NotImplementedError

    def decommission_device(self, device_id: str, at: float) -> bool:
        """Take the device out of the fleet at ``at``; False when there is no such device or it is out already."""
        cursor = self._execute("UPDATE devices SET decommissioned=? WHERE id=? AND decommissioned IS NULL", (at, device_id))
        return bool(cursor.rowcount == 1)

    def decommissioned_ids(self) -> set[str]:
        """Devices taken out of the fleet: the decommissioned ones kept, and the deleted ones."""
        rows = self._all("SELECT id FROM devices WHERE decommissioned IS NOT NULL UNION SELECT id FROM deleted_devices")
        return {str(r["id"]) for r in rows}

    def unwithdrawn(self) -> list[str]:
        """Decommissioned devices whose retained desired state the controller has not cleared on the broker yet."""
        rows = self._all("SELECT id FROM devices WHERE decommissioned IS NOT NULL AND withdrawn IS NULL ORDER BY id")
        return [str(r["id"]) for r in rows]

    def mark_withdrawn(self, device_id: str, at: float) -> None:
        self._execute("UPDATE devices SET withdrawn=? WHERE id=? AND decommissioned IS NOT NULL", (at, device_id))

    def delete_device(self, device_id: str) -> bool:
        """Remove a decommissioned device's row, served models and history; False unless it is decommissioned."""
        with self.batch():
            rows = self._all("SELECT decommissioned FROM devices WHERE id=? AND decommissioned IS NOT NULL", (device_id,))
            if not rows or self._execute("DELETE FROM devices WHERE id=? AND decommissioned IS NOT NULL",
                                         (device_id,)).rowcount != 1:
                return False
            self._execute("INSERT INTO deleted_devices(id, decommissioned, deleted) VALUES (?,?,?) ON CONFLICT(id) DO NOTHING",
                          (device_id, rows[0]["decommissioned"], time.time()))
            for table in DEVICE_TABLES:
                self._execute(f"DELETE FROM {table} WHERE device_id=?", (device_id,))
        return True

    def _unlist_package(self, variant: str) -> bool:
        """Drop the uploaded package's entry; False when none is listed."""
        return bool(self._execute("DELETE FROM packages WHERE variant=?", (variant,)).rowcount == 1)
