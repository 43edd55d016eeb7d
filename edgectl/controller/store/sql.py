"""The queries both back-ends share: written once with ``?`` placeholders and standard upserts.

A back-end supplies :meth:`SqlStore._execute` (``at_once``: device observations, events and the
history points and latency figures of telemetry reports, which PostgreSQL writes at once on a second
connection so that replicas never wait on each other's batches), its row id column, ``batch``,
``close``, ``release``, ``lease``, where packages are kept and the JSON hooks of the console's
queries (``console.py``).
"""

from __future__ import annotations

import copy
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

from edgecore.protocol.reports import Birth, DeviceState, Telemetry
from edgectl.controller.history import TelemetryPoint
from edgectl.controller.records import (
    AuditEntry,
    DeviceEventRow,
    DeviceRecord,
    DeviceStatus,
    LatencyPoint,
    ModelRef,
    Phase,
    RolloutDevice,
    RolloutRow,
    RolloutSpec,
    RolloutStatus,
)
from edgectl.controller.store.audit import AuditSql
from edgectl.controller.store.console import ConsoleSql
from edgectl.controller.store.device_configs import ConfigSql
from edgectl.controller.store.groups import GroupSql
from edgectl.controller.store.logs import LogSql
from edgectl.controller.store.protocol import DEVICE_FIELDS, GUARDED, Fenced, LeaseToken, Retention
from edgectl.controller.store.retired import RetiredSql
from edgectl.controller.store.served import ServedSql
from edgectl.controller.store.webhooks import WebhookSql
from edgectl.controller.webhooks import event_of
from edgectl.json_text import dumps

__all__ = ["IDLE_CONNECTIONS", "Batch", "SqlStore"]

log = logging.getLogger(__name__)

IDLE_CONNECTIONS = 8  # released connections kept for the next thread (per kind)
HISTORY_COLUMNS = ("device_id", "ts", "model", "version", "p50_ms", "p95_ms", "cpu_percent", "memory_percent", "requests",
                   "rate_rps")
# Once per report (device, claimed time, model: the unique index of migration 7): a copy is ignored.
ADD_HISTORY = (f"INSERT INTO telemetry_history({', '.join(HISTORY_COLUMNS)}, claimed) "
               f"VALUES ({', '.join('?' * (len(HISTORY_COLUMNS) + 1))}) ON CONFLICT DO NOTHING")
LATENCY_COLUMNS = "device_id, ts, model, version, p95_ms, source, claimed"

ROLLOUT_COLUMNS = ("id", "created", "status", "spec", "wave", "phase", "phase_since", "reason", "updated")
ROW_COLUMNS = ("rollout_id", "device_id", "wave", "variant", "status", "state", "detail", "data", "desired", "previous",
               "installed_at", "updated")
EVENT_KEY = "device_id=? AND ts=? AND deployment_id=? AND state=? AND status=?"


def _upsert(table: str, columns: Sequence[str], key: Sequence[str]) -> str:
    updates = ", ".join(f"{c}=excluded.{c}" for c in columns if c not in key)
    return (f"INSERT INTO {table}({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))}) "
            f"ON CONFLICT({', '.join(key)}) DO UPDATE SET {updates}")


class SqlStore(ConsoleSql, ServedSql, GroupSql, WebhookSql, RetiredSql, AuditSql, LogSql, ConfigSql):
    """Everything but connections; subclasses set ``rowid`` and implement the hooks below."""

    rowid = "rowid"
    fence_in_transaction = True  # the fence is checked in the database, in the write's own transaction
    # The engine lease's token while this is a fenced view (``fenced()``): engine writes check it.
    _fence: Callable[[], LeaseToken | None] | None = None

    def __init__(self, retention: Retention | None) -> None:
        self.retention = retention or Retention()
        self._pruning = _Pruning(time.monotonic() + self.retention.every_s)  # one object: fenced views share it

    # -- hooks ------------------------------------------------------------------------------------

    def _execute(self, sql: str, args: Sequence[Any] = (), at_once: bool = False) -> Any:
        """Run one statement (``?`` placeholders); return the cursor. ``at_once``: outside any batch.

        Raises :class:`StoreUnavailable` where the database cannot answer (the driver's error translated)."""
        raise NotImplementedError

    def _check_fence(self, token: LeaseToken) -> None:
        """In the current transaction: raise :class:`Fenced` unless the store holds ``token`` as the current lease."""
        raise NotImplementedError

    def batch(self) -> AbstractContextManager[None]:
        raise NotImplementedError

    def release(self) -> None:
        raise NotImplementedError

    def _all(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        cursor = self._execute(sql, args)
        return list(cursor.fetchall()) if cursor.description is not None else []

    # -- fencing ----------------------------------------------------------------------------------

    def fenced(self, token: Callable[[], LeaseToken | None]) -> Self:
        """A view on the same connections whose engine writes (:meth:`_engine_write`) carry ``token()``."""
        view = copy.copy(self)
        view._fence = token
        return view

    def _engine_write(self, sql: str, args: Sequence[Any]) -> Any:
        """A write only the engine leader makes: in a fenced view, one transaction with the store's check of the lease."""
        if self._fence is None:
            return self._execute(sql, args)
        token = self._fence()
        if token is None:
            raise Fenced("this controller does not hold the engine lease now: nothing written")
        if not self.fence_in_transaction:
            self._check_fence(token)
            return self._execute(sql, args)
        with self.batch():
            self._check_fence(token)
            return self._execute(sql, args)

    # -- devices ----------------------------------------------------------------------------------

    def upsert_device(self, device_id: str, **fields: Any) -> None:
        unknown = set(fields) - set(DEVICE_FIELDS)
        if unknown:
            raise ValueError(f"unknown device field {sorted(unknown)[0]}")
        values = {k: dumps(v.to_json()) if isinstance(v, (Birth, DeviceState, Telemetry)) else v for k, v in fields.items()}
        new = self._execute("INSERT INTO devices(id) SELECT ? WHERE NOT EXISTS (SELECT 1 FROM deleted_devices WHERE id=?) "
                            "ON CONFLICT(id) DO NOTHING", (device_id, device_id), at_once=True)  # a deleted id stays so
        if new.rowcount == 1:  # once, whichever replica stored the device's first report (a webhook event)
            self.audit("device registered", "first report", device_id=device_id)
        plain = dict(values)
        for guard, columns in GUARDED.items():
            if guard not in values:
                continue
            group = {c: plain.pop(c) for c in columns if c in plain}
            group[guard] = plain.pop(guard)
            sets = ", ".join(f"{c}=?" for c in group)
            self._execute(f"UPDATE devices SET {sets} WHERE id=? AND ({guard} IS NULL OR {guard}<=?)",
                          (*group.values(), device_id, group[guard]), at_once=True)
        if plain:
            sets = ", ".join(f"{c}=?" for c in plain)
            self._execute(f"UPDATE devices SET {sets} WHERE id=?", (*plain.values(), device_id), at_once=True)
        if isinstance(fields.get("state"), DeviceState):  # what it serves, one row a model (store/served.py)
            self._index_models(device_id, fields["state"], fields.get("state_at"))

    def devices(self) -> list[DeviceRecord]:
        """The fleet's devices: decommissioned ones are kept for history, not listed (``device()`` reads them)."""
        return [self._device(r) for r in self._all("SELECT * FROM devices WHERE decommissioned IS NULL ORDER BY id")]

    def device(self, device_id: str) -> DeviceRecord | None:
        rows = self._all("SELECT * FROM devices WHERE id=?", (device_id,))
        return self._device(rows[0]) if rows else None

    def telemetry_summary(self) -> tuple[int, float | None]:
        row = self._all("SELECT SUM(CASE WHEN online=1 THEN 1 ELSE 0 END) AS online, MAX(telemetry_ts) AS newest "
                        "FROM devices WHERE decommissioned IS NULL")[0]
        return int(row["online"] or 0), None if row["newest"] is None else float(row["newest"])

    @staticmethod
    def _device(r: Any) -> DeviceRecord:
        return DeviceRecord.from_columns(r["id"], r["online"], r["last_seen"], r["birth"], r["state"], r["telemetry"],
                                         r["telemetry_ts"], r["decommissioned"])

    def add_latency(self, device_id: str, model: str, version: int, p95_ms: float, source: str, ts: float,
                    claimed: float | None = None) -> bool:
        args = (device_id, ts, model, version, p95_ms, source, claimed)
        if claimed is None:  # the engine's own figure (a health check), or a report that claims no time: kept each time
            self._engine_write(f"INSERT INTO latency({LATENCY_COLUMNS}) VALUES (?,?,?,?,?,?,?)", args)
            added = True
        else:  # a device's report, which every replica may have received: once, written at once (see add_telemetry)
            added = bool(self._execute(f"INSERT INTO latency({LATENCY_COLUMNS}) VALUES (?,?,?,?,?,?,?) "
                                       "ON CONFLICT DO NOTHING", args, at_once=True).rowcount == 1)
        if added:
            self._written(device_id)
        return added

    def latency(self, device_id: str, model: str | None = None, version: int | None = None,
                since: float = 0.0, limit: int = 500) -> list[LatencyPoint]:
        sql = "SELECT * FROM latency WHERE device_id=? AND ts>=?"
        args: list[Any] = [device_id, since]
        if model is not None:
            sql, args = sql + " AND model=?", [*args, model]
        if version is not None:
            sql, args = sql + " AND version=?", [*args, version]
        rows = self._all(sql + f" ORDER BY ts DESC, {self.rowid} DESC LIMIT ?", (*args, limit))
        return [LatencyPoint(r["device_id"], r["ts"], r["model"], r["version"], r["p95_ms"], r["source"]) for r in reversed(rows)]

    # -- telemetry history --------------------------------------------------------------------------

    def add_telemetry(self, point: TelemetryPoint, claimed: float | None = None) -> bool:
        """Written at once, outside the caller's batch, as the device's other observations are: two replicas that
        received the same report insert the same key, and in their batches one would wait for the other's to end
        (or both deadlock, each holding a key the other inserts next)."""
        added = bool(self._execute(ADD_HISTORY, (*(getattr(point, c) for c in HISTORY_COLUMNS), claimed),
                                   at_once=True).rowcount == 1)
        if added:
            self._written(point.device_id)
        return added

    def telemetry_history(self, device_id: str, since: float = 0.0, limit: int = 500) -> list[TelemetryPoint]:
        rows = self._all(f"SELECT * FROM telemetry_history WHERE device_id=? AND ts>=? ORDER BY ts DESC, {self.rowid} DESC "
                         "LIMIT ?", (device_id, since, limit))
        return [TelemetryPoint(**{c: r[c] for c in HISTORY_COLUMNS}) for r in reversed(rows)]

    # -- events -----------------------------------------------------------------------------------

    def add_event(self, device_id: str, ts: float, deployment_id: str, state: str, status: str, detail: str,
                  data: dict[str, Any]) -> None:
        self._execute("INSERT INTO events(device_id, ts, deployment_id, state, status, detail, data, claimed) "
                      "VALUES (?,?,?,?,?,?,?,0) ON CONFLICT DO NOTHING",
                      (device_id, ts, deployment_id, state, status, detail, dumps(data)), at_once=True)
        self._written(device_id)

    def claim_event(self, event: DeviceEventRow) -> bool:
        cursor = self._engine_write(f"UPDATE events SET claimed=1 WHERE {EVENT_KEY} AND claimed=0",
                                    (event.device_id, event.ts, event.deployment_id, event.state, event.status))
        return bool(cursor.rowcount == 1)

    def unclaimed_events(self, limit: int = 1000) -> list[DeviceEventRow]:
        rows = self._all(f"SELECT * FROM events WHERE claimed=0 ORDER BY ts, {self.rowid} LIMIT ?", (limit,))
        return [self._event(r) for r in rows]

    def events(self, device_id: str, limit: int = 20) -> list[DeviceEventRow]:
        rows = self._all(f"SELECT * FROM events WHERE device_id=? ORDER BY ts DESC, {self.rowid} DESC LIMIT ?",
                         (device_id, limit))
        return [self._event(r) for r in reversed(rows)]

    @staticmethod
    def _event(r: Any) -> DeviceEventRow:
        return DeviceEventRow(r["device_id"], r["ts"], r["deployment_id"], r["state"], r["status"], r["detail"],
                              json.loads(r["data"] or "{}"))

    # -- retention --------------------------------------------------------------------------------

    def _written(self, device_id: str) -> None:
        with self._pruning.lock:
            self._pruning.touched.add(device_id)
            due = time.monotonic() >= self._pruning.due
        if due:
            self._prune(self._take_touched(), time.time())

    def _take_touched(self) -> set[str]:
        pruning = self._pruning
        with pruning.lock:
            touched = set(pruning.touched)
            pruning.touched.clear()
            pruning.due = time.monotonic() + self.retention.every_s
        return touched

    def prune(self, now: float | None = None) -> int:
        self._take_touched()
        ids = {r["device_id"] for r in self._all("SELECT DISTINCT device_id FROM latency")}
        ids |= {r["device_id"] for r in self._all("SELECT DISTINCT device_id FROM events")}
        ids |= {r["device_id"] for r in self._all("SELECT DISTINCT device_id FROM telemetry_history")}
        return self._prune(ids, time.time() if now is None else now)

    def _prune(self, device_ids: Iterable[str], now: float) -> int:
        """Keep the newest rows per device within the counts, and none older than the age limit."""
        keep, gone = self.retention, 0
        tables = (("latency", keep.latency_rows, ""), ("events", keep.events, " AND claimed=1"),
                  ("telemetry_history", keep.telemetry_rows, ""))
        with self.batch():
            for device_id in sorted(device_ids):
                for table, limit, extra in tables:
                    if limit > 0:
                        gone += self._execute(
                            f"DELETE FROM {table} WHERE device_id=?{extra} AND ts < (SELECT ts FROM {table} "
                            f"WHERE device_id=? ORDER BY ts DESC LIMIT 1 OFFSET ?)", (device_id, device_id, limit - 1)).rowcount
            if keep.max_age_s > 0:
                gone += self._execute("DELETE FROM latency WHERE ts < ?", (now - keep.max_age_s,)).rowcount
                gone += self._execute("DELETE FROM events WHERE ts < ? AND claimed=1", (now - keep.max_age_s,)).rowcount
                gone += self._execute("DELETE FROM telemetry_history WHERE ts < ?", (now - keep.max_age_s,)).rowcount
        return int(gone)

    # -- rollouts ---------------------------------------------------------------------------------

    def create_rollout(self, rollout: RolloutRow, devices: Iterable[RolloutDevice]) -> None:
        with self.batch():
            self.save_rollout(rollout)
            for row in devices:
                self.save_rollout_device(row)

    def save_rollout(self, rollout: RolloutRow) -> None:
        rollout.updated = time.time()
        self._engine_write(_upsert("rollouts", ROLLOUT_COLUMNS, ("id",)),
                           (rollout.id, rollout.created, rollout.status.value, dumps(rollout.spec.to_dict()), rollout.wave,
                            rollout.phase.value, rollout.phase_since, rollout.reason, rollout.updated))

    def rollout(self, rollout_id: str) -> RolloutRow | None:
        rows = self._all("SELECT * FROM rollouts WHERE id=?", (rollout_id,))
        return self._rollout(rows[0]) if rows else None

    def rollouts(self, statuses: Iterable[RolloutStatus] | None = None) -> list[RolloutRow]:
        wanted = None if statuses is None else {RolloutStatus(s).value for s in statuses}
        rows = self._all("SELECT * FROM rollouts ORDER BY created")
        return [self._rollout(r) for r in rows if wanted is None or r["status"] in wanted]

    @staticmethod
    def _rollout(r: Any) -> RolloutRow:
        return RolloutRow(r["id"], r["created"], RolloutStatus(r["status"]), RolloutSpec.from_dict(json.loads(r["spec"])),
                          r["wave"], Phase(r["phase"]), r["phase_since"], r["reason"], r["updated"])

    def rollout_devices(self, rollout_id: str) -> list[RolloutDevice]:
        rows = self._all("SELECT * FROM rollout_devices WHERE rollout_id=? ORDER BY wave, device_id", (rollout_id,))
        return [self._rollout_device(r) for r in rows]

    def device_rollouts(self, device_id: str) -> list[RolloutDevice]:
        """One device's rows in every rollout, oldest rollout first."""
        rows = self._all("SELECT d.* FROM rollout_devices d JOIN rollouts r ON r.id = d.rollout_id "
                         "WHERE d.device_id=? ORDER BY r.created", (device_id,))
        return [self._rollout_device(r) for r in rows]

    @staticmethod
    def _rollout_device(r: Any) -> RolloutDevice:
        desired = r["desired"]
        return RolloutDevice(r["rollout_id"], r["device_id"], r["wave"], r["variant"], DeviceStatus(r["status"]),
                             r["state"] or "", r["detail"] or "", json.loads(r["data"] or "{}"),
                             None if desired is None else bytes(desired),
                             ModelRef.from_dict(json.loads(r["previous"] or "{}")), r["installed_at"], r["updated"])

    def save_rollout_device(self, row: RolloutDevice) -> None:
        row.updated = time.time()
        self._engine_write(_upsert("rollout_devices", ROW_COLUMNS, ("rollout_id", "device_id")),
                           (row.rollout_id, row.device_id, row.wave, row.variant, row.status.value, row.state, row.detail,
                            dumps(row.data), row.desired, dumps(row.previous.to_dict()), row.installed_at, row.updated))

    # -- audit and requests -----------------------------------------------------------------------

    def audit(self, action: str, detail: str = "", rollout_id: str = "", device_id: str = "", actor: str = "controller") -> None:
        """An audit entry; one that is a webhook event commits with its deliveries (store/webhooks.py)."""
        ts = time.time()
        with self.batch() if event_of(action) else nullcontext():
            self._engine_write("INSERT INTO audit(ts, actor, rollout_id, device_id, action, detail) VALUES (?,?,?,?,?,?)",
                               (ts, actor, rollout_id, device_id, action, detail))
            self._announce(action, ts, actor, rollout_id, device_id, detail)

    def audit_log(self, rollout_id: str | None = None, device_id: str | None = None, limit: int = 1000) -> list[AuditEntry]:
        sql = "SELECT * FROM audit WHERE 1=1"
        args: list[Any] = []
        if rollout_id:
            sql, args = sql + " AND rollout_id=?", [*args, rollout_id]
        if device_id:
            sql, args = sql + " AND device_id=?", [*args, device_id]
        rows = self._all(sql + " ORDER BY id DESC LIMIT ?", (*args, limit))
        return [AuditEntry(r["id"], r["ts"], r["actor"], r["rollout_id"] or "", r["device_id"] or "", r["action"],
                           r["detail"] or "") for r in reversed(rows)]

    def request(self, rollout_id: str, action: str) -> None:
        """Queue an operator action (pause, resume, abort, retry-failed) for the controller."""
        self._execute("INSERT INTO requests(ts, rollout_id, action) VALUES (?,?,?)", (time.time(), rollout_id, action))

    def take_requests(self) -> list[tuple[str, str]]:
        with self.batch():
            rows = self._all("SELECT id, rollout_id, action FROM requests WHERE done=0 ORDER BY id")
            for r in rows:
                self._engine_write("UPDATE requests SET done=1 WHERE id=?", (r["id"],))
        return [(r["rollout_id"], r["action"]) for r in rows]


@dataclass
class _Pruning:
    """Devices written since the last pruning, and when the next one is due."""

    due: float
    touched: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)


class Batch(AbstractContextManager[None]):
    """One transaction around a ``with`` block; a nested batch joins the outer one.

    ``execute`` runs BEGIN, COMMIT and ROLLBACK (translating the driver's errors); ``on_end`` runs
    when the outer transaction ends either way. A ROLLBACK that fails because the connection broke
    is logged, never raised over the error that caused it."""

    def __init__(self, begin: str, in_transaction: bool, execute: Callable[[str], Any],
                 on_end: Callable[[], None] = lambda: None) -> None:
        self.begin, self.outer, self.execute, self.on_end = begin, not in_transaction, execute, on_end

    def __enter__(self) -> None:
        if self.outer:
            self.execute(self.begin)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if not self.outer:
            return
        try:
            if exc_type is None:
                self.execute("COMMIT")
                return
            try:
                self.execute("ROLLBACK")
            except Exception as failed:  # the connection that failed the block often cannot roll back either
                log.debug("ROLLBACK after %s failed too: %s", exc_type.__name__, failed)
        finally:
            self.on_end()
