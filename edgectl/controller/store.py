"""The controller's store: devices, latency history, rollouts, per-device rollout rows, audit log.

:class:`Store` is the interface the controller and the CLI use; :class:`SqliteStore` implements it
on one SQLite file in WAL mode, so ``edgectl deploy`` / ``rollout pause`` and the running
``edgectl controller run`` can share it. A PostgreSQL store implements the same methods.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

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


@dataclass
class DeviceRow:
    """What the controller knows of one device from its retained messages and telemetry."""

    id: str
    online: bool | None = None
    last_seen: float | None = None
    birth: dict[str, Any] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)
    telemetry: dict[str, Any] = field(default_factory=dict)
    telemetry_ts: float | None = None


@dataclass
class RolloutRow:
    """One rollout: its spec (packages, waves, gates, options) and where it stands."""

    id: str
    created: float
    status: str  # running | paused | rolling-back | aborting | rolled-back | aborted | done
    spec: dict[str, Any]
    wave: int = 0
    phase: str = "start"  # start | installing | baking | rollback (after a halt or an abort)
    phase_since: float = 0.0
    reason: str = ""
    updated: float = 0.0


@dataclass
class RolloutDevice:
    """One device's part in a rollout."""

    rollout_id: str
    device_id: str
    wave: int
    variant: str  # variant id (manifest sha256) of the package this device gets ("" when skipped)
    # planned|skipped|sent|deferred|running|ok|failed|rollback-sent|rolled-back|cancelled|superseded
    status: str
    state: str = ""
    detail: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    desired: bytes | None = None
    previous: dict[str, Any] = field(default_factory=dict)
    installed_at: float | None = None
    updated: float = 0.0


class Store(Protocol):
    """What the controller needs from persistent storage."""

    def upsert_device(self, device_id: str, **fields: Any) -> None: ...
    def devices(self) -> list[DeviceRow]: ...
    def device(self, device_id: str) -> DeviceRow | None: ...
    def add_latency(self, device_id: str, model: str, version: int, p95_ms: float, source: str, ts: float) -> None: ...
    def latency(self, device_id: str, model: str | None = None, version: int | None = None,
                since: float = 0.0, limit: int = 500) -> list[dict[str, Any]]: ...
    def add_event(self, device_id: str, ts: float, deployment_id: str, state: str, status: str, detail: str, data: dict[str, Any]) -> None: ...
    def events(self, device_id: str, limit: int = 20) -> list[dict[str, Any]]: ...
    def create_rollout(self, rollout: RolloutRow, devices: Iterable[RolloutDevice]) -> None: ...
    def save_rollout(self, rollout: RolloutRow) -> None: ...
    def rollout(self, rollout_id: str) -> RolloutRow | None: ...
    def rollouts(self, statuses: tuple[str, ...] | None = None) -> list[RolloutRow]: ...
    def rollout_devices(self, rollout_id: str) -> list[RolloutDevice]: ...
    def device_rollouts(self, device_id: str) -> list[RolloutDevice]: ...
    def save_rollout_device(self, row: RolloutDevice) -> None: ...
    def audit(self, action: str, detail: str = "", rollout_id: str = "", device_id: str = "", actor: str = "controller") -> None: ...
    def audit_log(self, rollout_id: str | None = None, device_id: str | None = None, limit: int = 1000) -> list[dict[str, Any]]: ...
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
        db = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.row_factory = sqlite3.Row
            self._local.db = db
        return db

    def batch(self) -> _Batch:
        """``with store.batch():`` groups many writes in one transaction (telemetry ingest)."""
        return _Batch(self._db())

    # -- devices ----------------------------------------------------------------------------

    def upsert_device(self, device_id: str, **fields: Any) -> None:
        db = self._db()
        db.execute("INSERT OR IGNORE INTO devices(id) VALUES (?)", (device_id,))
        for key, value in fields.items():
            if key not in ("online", "last_seen", "birth", "state", "telemetry", "telemetry_ts"):
                raise ValueError(f"unknown device field {key}")
            if isinstance(value, dict):
                value = _dumps(value)
            db.execute(f"UPDATE devices SET {key}=? WHERE id=?", (value, device_id))

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
                since: float = 0.0, limit: int = 500) -> list[dict[str, Any]]:
        sql = "SELECT * FROM latency WHERE device_id=? AND ts>=?"
        args: list[Any] = [device_id, since]
        if model is not None:
            sql, args = sql + " AND model=?", [*args, model]
        if version is not None:
            sql, args = sql + " AND version=?", [*args, version]
        rows = self._db().execute(sql + " ORDER BY ts DESC LIMIT ?", (*args, limit)).fetchall()
        return [dict(r) for r in reversed(rows)]

    def add_event(self, device_id: str, ts: float, deployment_id: str, state: str, status: str, detail: str, data: dict[str, Any]) -> None:
        self._db().execute("INSERT INTO events VALUES (?,?,?,?,?,?,?)",
                           (device_id, ts, deployment_id, state, status, detail, _dumps(data)))

    def events(self, device_id: str, limit: int = 20) -> list[dict[str, Any]]:
        rows = self._db().execute("SELECT * FROM events WHERE device_id=? ORDER BY ts DESC LIMIT ?", (device_id, limit))
        return [{**dict(r), "data": json.loads(r["data"] or "{}")} for r in reversed(rows.fetchall())]

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
            (rollout.id, rollout.created, rollout.status, _dumps(rollout.spec), rollout.wave, rollout.phase,
             rollout.phase_since, rollout.reason, rollout.updated),
        )

    def rollout(self, rollout_id: str) -> RolloutRow | None:
        row = self._db().execute("SELECT * FROM rollouts WHERE id=?", (rollout_id,)).fetchone()
        return self._rollout(row) if row else None

    def rollouts(self, statuses: tuple[str, ...] | None = None) -> list[RolloutRow]:
        rows = self._db().execute("SELECT * FROM rollouts ORDER BY created").fetchall()
        found = [self._rollout(r) for r in rows]
        return [r for r in found if statuses is None or r.status in statuses]

    @staticmethod
    def _rollout(r: sqlite3.Row) -> RolloutRow:
        return RolloutRow(r["id"], r["created"], r["status"], json.loads(r["spec"]), r["wave"], r["phase"],
                          r["phase_since"], r["reason"], r["updated"])

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
        return RolloutDevice(r["rollout_id"], r["device_id"], r["wave"], r["variant"], r["status"], r["state"] or "",
                             r["detail"] or "", json.loads(r["data"] or "{}"), r["desired"], json.loads(r["previous"] or "{}"),
                             r["installed_at"], r["updated"])

    def save_rollout_device(self, row: RolloutDevice) -> None:
        row.updated = time.time()
        self._db().execute(
            "INSERT OR REPLACE INTO rollout_devices VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            (row.rollout_id, row.device_id, row.wave, row.variant, row.status, row.state, row.detail,
             _dumps(row.data), row.desired, _dumps(row.previous), row.installed_at, row.updated),
        )

    # -- audit and requests -----------------------------------------------------------------

    def audit(self, action: str, detail: str = "", rollout_id: str = "", device_id: str = "", actor: str = "controller") -> None:
        self._db().execute("INSERT INTO audit(ts, actor, rollout_id, device_id, action, detail) VALUES (?,?,?,?,?,?)",
                           (time.time(), actor, rollout_id, device_id, action, detail))

    def audit_log(self, rollout_id: str | None = None, device_id: str | None = None, limit: int = 1000) -> list[dict[str, Any]]:
        sql = "SELECT * FROM audit WHERE 1=1"
        args: list[Any] = []
        if rollout_id:
            sql, args = sql + " AND rollout_id=?", [*args, rollout_id]
        if device_id:
            sql, args = sql + " AND device_id=?", [*args, device_id]
        rows = self._db().execute(sql + " ORDER BY id DESC LIMIT ?", (*args, limit)).fetchall()
        return [dict(r) for r in reversed(rows)]

    def request(self, rollout_id: str, action: str) -> None:
        """Queue an operator action (pause, resume, abort, retry-failed) for the controller."""
        self._db().execute("INSERT INTO requests(ts, rollout_id, action) VALUES (?,?,?)", (time.time(), rollout_id, action))

    def take_requests(self) -> list[tuple[str, str]]:
        db = self._db()
        with self.batch():
            rows = db.execute("SELECT id, rollout_id, action FROM requests WHERE done=0 ORDER BY id").fetchall()
            db.executemany("UPDATE requests SET done=1 WHERE id=?", [(r["id"],) for r in rows])
        return [(r["rollout_id"], r["action"]) for r in rows]


class _Batch:
    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        self.outer = False

    def __enter__(self) -> None:
        self.outer = not self.db.in_transaction
        if self.outer:
            self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        if self.outer:
            self.db.execute("ROLLBACK" if exc_type else "COMMIT")
