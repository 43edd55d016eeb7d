"""What each device serves, one row per model or pipeline (``device_models``): kept with the device's state.

A device runs several models; the console filters and counts devices by model in SQL, which a
JSON list inside ``devices.state`` would make engine-specific and slow. The rows are written
whenever a state is stored, and only while that state is the one the ``devices`` row keeps (its
``state_at`` equals the stored report's): a state ingested out of order, which the guarded write of
``devices`` refused, cannot replace the rows of a newer one. Migration 6 made the rows of the states
stored before (their ``models``, or the one ``active`` model of agents from before sets).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from edgecore.protocol.reports import DeviceState
from edgectl.controller.records import served_models

__all__ = ["MODEL_COLUMNS", "ServedSql"]

MODEL_COLUMNS = ("device_id", "name", "version", "kind", "backend", "artifact_id", "deployment_id", "footprint_mb")
_KEPT = "EXISTS (SELECT 1 FROM devices WHERE id=? AND state_at=?)"


class ServedSql:
    """Writes ``device_models`` with each stored state; a back-end supplies ``_execute``."""

    def _execute(self, sql: str, args: Sequence[Any] = (), at_once: bool = False) -> Any:
        raise NotImplementedError

    def _index_models(self, device_id: str, state: DeviceState, state_at: float | None) -> None:
        """Replace the device's rows with ``state``'s models, unless a newer state is kept (``state_at`` given)."""
        guard, guard_args = (f" AND {_KEPT}", (device_id, state_at)) if state_at is not None else ("", ())
        self._execute(f"DELETE FROM device_models WHERE device_id=?{guard}", (device_id, *guard_args), at_once=True)
        insert = (f"INSERT INTO device_models({', '.join(MODEL_COLUMNS)}) SELECT {', '.join('?' * len(MODEL_COLUMNS))} "
                  f"WHERE {_KEPT if state_at is not None else '1=1'} ON CONFLICT(device_id, name) DO UPDATE SET "
                  + ", ".join(f"{c}=excluded.{c}" for c in MODEL_COLUMNS[2:]))
        for m in served_models(state):
            self._execute(insert, (device_id, m.name, m.version, m.kind, m.backend, m.artifact_id, m.deployment_id,
                                   m.footprint_mb, *guard_args), at_once=True)
