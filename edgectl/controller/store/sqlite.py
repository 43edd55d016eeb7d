"""The store in one SQLite file: the default, for one controller on one machine.

WAL mode lets ``edgectl deploy`` / ``rollout pause`` read and write while ``edgectl controller run``
runs; one connection per thread (a released one waits in a small idle pool for the next thread). A
second controller on the same file is refused: the engine lease is an exclusive lock on
``<file>.controller.lock`` (replicas need PostgreSQL), which is also the fence: no other process
can lead, so fenced writes need no check in the file. The clock is this machine's.

SQLite's errors that say the file cannot be written now (full disk, I/O error, read-only, locked
past the timeout, cannot be opened) are :class:`StoreUnavailable`; the controller retries them, and
counts the store back only once :meth:`SqliteStore.ping` commits a write (on a full disk reads still answer).
"""

from __future__ import annotations

import shutil
import sqlite3
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgectl.controller.store.migrations import migrate
from edgectl.controller.store.protocol import LeaseToken, Retention, StoreUnavailable
from edgectl.controller.store.sql import IDLE_CONNECTIONS, Batch, SqlStore

if TYPE_CHECKING:
    from edgectl.controller.leader import FileLease

__all__ = ["SqliteStore"]

TAG_KEYS = ("SELECT DISTINCT j.key AS key FROM devices, json_each(devices.birth, '$.tags') j "
            "WHERE json_type(devices.birth, '$.tags') = 'object'")
LAGS = ("SELECT telemetry_ts - json_extract(telemetry, '$.ts') AS lag FROM devices "
        "WHERE telemetry_ts >= ? AND json_type(telemetry, '$.ts') IN ('real', 'integer')")
# Primary result codes meaning the file cannot be used now (sqlite3.h): busy, locked, out of memory,
# read-only, I/O error, disk full, cannot open, lock protocol.
UNAVAILABLE = {5, 6, 7, 8, 10, 13, 14, 15}


class SqliteStore(SqlStore):
    """The store in one SQLite file; one connection per thread, WAL for concurrent readers."""

    fence_in_transaction = False

    def __init__(self, path: Path, retention: Retention | None = None) -> None:
        super().__init__(retention)
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._idle: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        with self.batch():
            migrate(lambda sql, args: self._all(sql, args), "sqlite", str(path))

    def _db(self) -> sqlite3.Connection:
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None:
            with self._lock:
                db = self._idle.pop() if self._idle else None
            if db is None:
                db = self._open()
                with self._lock:
                    self._connections.append(db)
            self._local.db = db
        return db

    def _open(self) -> sqlite3.Connection:
        try:
            db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
        except sqlite3.OperationalError as exc:
            raise self._failed(exc) from exc
        db.row_factory = sqlite3.Row
        return db

    def release(self) -> None:
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None:
            return
        self._local.db = None
        with self._lock:
            if not db.in_transaction and len(self._idle) < IDLE_CONNECTIONS:
                self._idle.append(db)
                return
            self._connections.remove(db)
        db.close()

    def _execute(self, sql: str, args: Sequence[Any] = (), at_once: bool = False) -> Any:
        return self._run(self._db(), sql, tuple(args))

    def _run(self, db: sqlite3.Connection, sql: str, args: tuple[Any, ...] = ()) -> Any:
        try:
            return db.execute(sql, args)
        except sqlite3.OperationalError as exc:
            raise self._failed(exc) from exc

    def _failed(self, exc: sqlite3.OperationalError) -> Exception:
        """StoreUnavailable for a file that cannot be used now; the error itself for a query this code got wrong."""
        if getattr(exc, "sqlite_errorcode", 0) & 0xFF in UNAVAILABLE:
            return StoreUnavailable(f"the SQLite store {self.path} is unavailable: {exc}")
        return exc

    def location(self) -> str:
        return str(self.path)

    def batch(self) -> Batch:
        db = self._db()
        return Batch("BEGIN IMMEDIATE", db.in_transaction, lambda sql: self._run(db, sql))

    def now(self) -> float:
        return time.time()

    def ping(self) -> None:
        """A write that needs room: a full disk answers reads (``SELECT 1``) and refuses every commit."""
        with self.batch():
            version = int(self._all("PRAGMA user_version")[0][0])
            self._execute(f"PRAGMA user_version = {version}")  # unchanged, yet its page is written at the commit

    def _check_fence(self, token: LeaseToken) -> None:
        """The file lock is the fence: while this process holds a token, no other controller can run here."""

    def connections(self) -> int:
        with self._lock:
            return len(self._connections)

    def close(self) -> None:
        with self._lock:
            connections, self._connections, self._idle = self._connections, [], []
        for db in connections:
            db.close()
        self._local = threading.local()

    # -- JSON in SQLite ---------------------------------------------------------------------------

    def _json(self, column: str, path: str) -> str:
        return f"json_extract({column}, '$.{path}')"

    def _json_tag(self, key: str) -> tuple[str, str]:
        return "json_extract(birth, ?)", f'$.tags."{key}"'

    def _tag_keys_sql(self) -> str:
        return TAG_KEYS

    def _lags_sql(self) -> str:
        return LAGS

    def lease(self) -> FileLease:
        from edgectl.controller.leader import FileLease  # the leader module reads this store's protocol

        return FileLease(self.path)

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

    def package_file(self, variant: str, recorded: Path) -> Path:
        return recorded

    def discard_package(self, variant: str) -> bool:
        listed = self._unlist_package(variant)
        (self.path.parent / "packages" / f"{variant}.edgepkg").unlink(missing_ok=True)
        return listed

