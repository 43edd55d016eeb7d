"""The controller's store: devices, latency history, rollouts, per-device rollout rows, audit log.

:class:`Store` is the whole interface the controller, the fleet domain layer and the CLI use;
:class:`SqliteStore` implements it on one SQLite file in WAL mode, so ``edgectl deploy`` /
``rollout pause`` and the running ``edgectl controller run`` can share it. Another engine (issue 15:
PostgreSQL) implements the same protocol. Records cross this boundary as the typed dataclasses of
:mod:`edgectl.controller.records`; JSON columns are their ``to_dict`` form.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import threading
import time
from collections.abc import Iterable
from contextlib import AbstractContextManager
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from edgectl.controller.records import (
    AuditEntry,
    DeviceEventRow,
    DeviceRow,
    DeviceStatus,
    LatencyPoint,
    ModelRef,
    Phase,
    RolloutDevice,
    RolloutRow,
    RolloutSpec,
    RolloutStatus,
)

__all__ = ["DeviceRow", "RolloutDevice", "RolloutRow", "SqliteStore", "Store"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS devices(
    id TEXT PRIMARY KEY, online INTEGER, last_seen REAL, birth TEXT, state TEXT,
    telemetry TEXT, telemetry_ts REAL);
CREATE TABLE IF NOT EXISTS latency(
    device_id TEXT, ts REAL, model TEXT, version INTEGER, p95_ms REAL, source TEXT);
CREATE INDEX IF NOT EXISTS latency_device ON latency(device_id, model, version, ts);
CREATE TABLE IF NOT EXISTS events(
    device_id TEXT, ts REAL, deployment_id TEXT, state TEXT, status TEXT, detail TEXT, data TEXT);
CREATE INDEX IF NOT EXISTS events_device ON events(device_id, ts);
CREATE TABLE IF NOT EXISTS rollouts(
    id TEXT PRIMARY KEY, created REAL, status TEXT, spec TEXT, wave INTEGER, phase TEXT,
    phase_since REAL, reason TEXT, updated REAL);
CREATE TABLE IF NOT EXISTS rollout_devices(
    rollout_id TEXT, device_id TEXT, wave INTEGER, variant TEXT, status TEXT, state TEXT,
    detail TEXT, data TEXT, desired BLOB, previous TEXT, installed_at REAL, updated REAL,
    PRIMARY KEY(rollout_id, device_id));
CREATE INDEX IF NOT EXISTS rollout_devices_device ON rollout_devices(device_id);
CREATE TABLE IF NOT EXISTS audit(
    id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL, actor TEXT, rollout_id TEXT, device_id TEXT,
    action TEXT, detail TEXT);
CREATE TABLE IF NOT EXISTS requests(
    id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL, rollout_id TEXT, action TEXT, done INTEGER DEFAULT 0);
"""


DEVICE_FIELDS = ("online", "last_seen", "birth", "state", "telemetry", "telemetry_ts")


class Store(Protocol):
    """What the controller, the fleet domain layer and the CLI need from persistent storage."""

    def location(self) -> str:
        """Where the store lives, for logs and the audit log (a path or a URL without credentials)."""
    def batch(self) -> AbstractContextManager[None]:
        """``with store.batch():`` groups writes in one transaction (nested batches join the outer one)."""
    def keep_package(self, variant: str, source: Path) -> Path:
        """Keep a rollout's package where every controller replica can read it; return where it lies."""
    def upsert_device(self, device_id: str, **fields: Any) -> None: ...
    def devices(self) -> list[DeviceRow]: ...
    def device(self, device_id: str) -> DeviceRow | None: ...
    def add_latency(self, device_id: str, model: str, version: int, p95_ms: float, source: str, ts: float) -> None: ...
    def latency(self, device_id: str, model: str | None = None, version: int | None = None,
                since: float = 0.0, limit: int = 500) -> list[LatencyPoint]: ...
    def add_event(self, device_id: str, ts: float, deployment_id: str, state: str, status: str, detail: str,
                  data: dict[str, Any]) -> None: ...
    def events(self, device_id: str, limit: int = 20) -> list[DeviceEventRow]: ...
    def create_rollout(self, rollout: RolloutRow, devices: Iterable[RolloutDevice]) -> None: ...
    def save_rollout(self, rollout: RolloutRow) -> None: ...
    def rollout(self, rollout_id: str) -> RolloutRow | None: ...
    def rollouts(self, statuses: Iterable[RolloutStatus] | None = None) -> list[RolloutRow]: ...
    def rollout_devices(self, rollout_id: str) -> list[RolloutDevice]: ...
    def device_rollouts(self, device_id: str) -> list[RolloutDevice]: ...
    def save_rollout_device(self, row: RolloutDevice) -> None: ...
    def audit(self, action: str, detail: str = "", rollout_id: str = "", device_id: str = "",
              actor: str = "controller") -> None: ...
    def audit_log(self, rollout_id: str | None = None, device_id: str | None = None, limit: int = 1000) -> list[AuditEntry]: ...
    def request(self, rollout_id: str, action: str) -> None: ...
    def take_requests(self) -> list[tuple[str, str]]: ...


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), default=str)


class SqliteStore:
    """The store in one SQLite file; one connection per thread, WAL for concurrent readers."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        with self._db() as db:
            db.executescript(SCHEMA)

    def _db(self) -> sqlite3.Connection:
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.row_factory = sqlite3.Row
            self._local.db = db
        return db

    def location(self) -> str:
        return str(self.path)

    def batch(self) -> _Batch:
        return _Batch(self._db())

    def keep_package(self, variant: str, source: Path) -> Path:
        """Packages lie in ``packages/`` next to the store file, named by variant (equal variants are equal files)."""
        keep = self.path.parent / "packages"
        keep.mkdir(parents=True, exist_ok=True)
        path = keep / f"{variant}.edgepkg"
        if not path.exists():
            partial = path.with_name(path.name + ".part")
            shutil.copyfile(source, partial)
            partial.replace(path)
        return path

    # -- devices ----------------------------------------------------------------------------

    def upsert_device(self, device_id: str, **fields: Any) -> None:
        db = self._db()
        db.execute("INSERT OR IGNORE INTO devices(id) VALUES (?)", (device_id,))
        for key, value in fields.items():
            if key not in DEVICE_FIELDS:
                raise ValueError(f"unknown device field {key}")
            db.execute(f"UPDATE devices SET {key}=? WHERE id=?", (_dumps(value) if isinstance(value, dict) else value, device_id))

    def devices(self) -> list[DeviceRow]:
        return [self._device(r) for r in self._db().execute("SELECT * FROM devices ORDER BY id")]

    def device(self, device_id: str) -> DeviceRow | None:
        row = self._db().execute("SELECT * FROM devices WHERE id=?", (device_id,)).fetchone()
        return self._device(row) if row else None

    @staticmethod
    def _device(r: sqlite3.Row) -> DeviceRow:
        return DeviceRow(
            r["id"], None if r["online"] is None else bool(r["online"]), r["last_seen"],
            json.loads(r["birth"] or "{}"), json.loads(r["state"] or "{}"),
            json.loads(r["telemetry"] or "{}"), r["telemetry_ts"],
        )

    def add_latency(self, device_id: str, model: str, version: int, p95_ms: float, source: str, ts: float) -> None:
        self._db().execute("INSERT INTO latency VALUES (?,?,?,?,?,?)", (device_id, ts, model, version, p95_ms, source))

    def latency(self, device_id: str, model: str | None = None, version: int | None = None,
                since: float = 0.0, limit: int = 500) -> list[LatencyPoint]:
        sql = "SELECT * FROM latency WHERE device_id=? AND ts>=?"
        args: list[Any] = [device_id, since]
        if model is not None:
            sql, args = sql + " AND model=?", [*args, model]
        if version is not None:
            sql, args = sql + " AND version=?", [*args, version]
        rows = self._db().execute(sql + " ORDER BY ts DESC LIMIT ?", (*args, limit)).fetchall()
        return [LatencyPoint(r["device_id"], r["ts"], r["model"], r["version"], r["p95_ms"], r["source"]) for r in reversed(rows)]

    def add_event(self, device_id: str, ts: float, deployment_id: str, state: str, status: str, detail: str,
                  data: dict[str, Any]) -> None:
        self._db().execute("INSERT INTO events VALUES (?,?,?,?,?,?,?)",
                           (device_id, ts, deployment_id, state, status, detail, _dumps(data)))

    def events(self, device_id: str, limit: int = 20) -> list[DeviceEventRow]:
        rows = self._db().execute("SELECT * FROM events WHERE device_id=? ORDER BY ts DESC LIMIT ?", (device_id, limit))
        return [DeviceEventRow(r["device_id"], r["ts"], r["deployment_id"], r["state"], r["status"], r["detail"],
                               json.loads(r["data"] or "{}")) for r in reversed(rows.fetchall())]

    # -- rollouts ---------------------------------------------------------------------------

    def create_rollout(self, rollout: RolloutRow, devices: Iterable[RolloutDevice]) -> None:
        with self.batch():
            self.save_rollout(rollout)
            for row in devices:
                self.save_rollout_device(row)

    def save_rollout(self, rollout: RolloutRow) -> None:
        rollout.updated = time.time()
        self._db().execute(
            "INSERT OR REPLACE INTO rollouts VALUES (?,?,?,?,?,?,?,?,?)",
            (rollout.id, rollout.created, rollout.status.value, _dumps(rollout.spec.to_dict()), rollout.wave,
             rollout.phase.value, rollout.phase_since, rollout.reason, rollout.updated),
        )

    def rollout(self, rollout_id: str) -> RolloutRow | None:
        row = self._db().execute("SELECT * FROM rollouts WHERE id=?", (rollout_id,)).fetchone()
        return self._rollout(row) if row else None

    def rollouts(self, statuses: Iterable[RolloutStatus] | None = None) -> list[RolloutRow]:
        wanted = None if statuses is None else {RolloutStatus(s).value for s in statuses}
        rows = self._db().execute("SELECT * FROM rollouts ORDER BY created").fetchall()
        return [self._rollout(r) for r in rows if wanted is None or r["status"] in wanted]

    @staticmethod
    def _rollout(r: sqlite3.Row) -> RolloutRow:
        return RolloutRow(r["id"], r["created"], RolloutStatus(r["status"]), RolloutSpec.from_dict(json.loads(r["spec"])),
                          r["wave"], Phase(r["phase"]), r["phase_since"], r["reason"], r["updated"])

    def rollout_devices(self, rollout_id: str) -> list[RolloutDevice]:
        rows = self._db().execute("SELECT * FROM rollout_devices WHERE rollout_id=? ORDER BY wave, device_id", (rollout_id,))
        return [self._rollout_device(r) for r in rows.fetchall()]

    def device_rollouts(self, device_id: str) -> list[RolloutDevice]:
        """One device's rows in every rollout, oldest rollout first."""
        rows = self._db().execute(
            "SELECT d.* FROM rollout_devices d JOIN rollouts r ON r.id = d.rollout_id WHERE d.device_id=? ORDER BY r.created",
            (device_id,))
        return [self._rollout_device(r) for r in rows.fetchall()]

    @staticmethod
    def _rollout_device(r: sqlite3.Row) -> RolloutDevice:
        return RolloutDevice(r["rollout_id"], r["device_id"], r["wave"], r["variant"], DeviceStatus(r["status"]),
                             r["state"] or "", r["detail"] or "", json.loads(r["data"] or "{}"), r["desired"],
                             ModelRef.from_dict(json.loads(r["previous"] or "{}")), r["installed_at"], r["updated"])

    def save_rollout_device(self, row: RolloutDevice) -> None:
        row.updated = time.time()
        self._db().execute(
            "INSERT OR REPLACE INTO rollout_devices VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            (row.rollout_id, row.device_id, row.wave, row.variant, row.status.value, row.state, row.detail,
             _dumps(row.data), row.desired, _dumps(row.previous.to_dict()), row.installed_at, row.updated),
        )

    # -- audit and requests -----------------------------------------------------------------

    def audit(self, action: str, detail: str = "", rollout_id: str = "", device_id: str = "", actor: str = "controller") -> None:
        self._db().execute("INSERT INTO audit(ts, actor, rollout_id, device_id, action, detail) VALUES (?,?,?,?,?,?)",
                           (time.time(), actor, rollout_id, device_id, action, detail))

    def audit_log(self, rollout_id: str | None = None, device_id: str | None = None, limit: int = 1000) -> list[AuditEntry]:
        sql = "SELECT * FROM audit WHERE 1=1"
        args: list[Any] = []
        if rollout_id:
            sql, args = sql + " AND rollout_id=?", [*args, rollout_id]
        if device_id:
            sql, args = sql + " AND device_id=?", [*args, device_id]
        rows = self._db().execute(sql + " ORDER BY id DESC LIMIT ?", (*args, limit)).fetchall()
        return [AuditEntry(r["id"], r["ts"], r["actor"], r["rollout_id"] or "", r["device_id"] or "", r["action"],
                           r["detail"] or "") for r in reversed(rows)]

    def request(self, rollout_id: str, action: str) -> None:
        """Queue an operator action (pause, resume, abort, retry-failed) for the controller."""
        self._db().execute("INSERT INTO requests(ts, rollout_id, action) VALUES (?,?,?)", (time.time(), rollout_id, action))

    def take_requests(self) -> list[tuple[str, str]]:
        db = self._db()
        with self.batch():
            rows = db.execute("SELECT id, rollout_id, action FROM requests WHERE done=0 ORDER BY id").fetchall()
            db.executemany("UPDATE requests SET done=1 WHERE id=?", [(r["id"],) for r in rows])
        return [(r["rollout_id"], r["action"]) for r in rows]


class _Batch(AbstractContextManager[None]):
    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        self.outer = False

    def __enter__(self) -> None:
        self.outer = not self.db.in_transaction
        if self.outer:
            self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self.outer:
            self.db.execute("ROLLBACK" if exc_type else "COMMIT")
