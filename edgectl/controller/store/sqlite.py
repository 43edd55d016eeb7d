"""The store in one SQLite file: the default, for one controller on one machine.

WAL mode lets ``edgectl deploy`` / ``rollout pause`` read and write while ``edgectl controller run``
runs; one connection per thread. A second controller on the same file is refused: the engine
lease is an exclusive lock on ``<file>.controller.lock`` (replicas need PostgreSQL).
"""

from __future__ import annotations

import shutil
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from edgectl.controller.leader import FileLease
from edgectl.controller.store.migrations import migrate
from edgectl.controller.store.protocol import Retention
from edgectl.controller.store.sql import Batch, SqlStore

__all__ = ["SqliteStore"]


class SqliteStore(SqlStore):
    """The store in one SQLite file; one connection per thread, WAL for concurrent readers."""

    def __init__(self, path: Path, retention: Retention | None = None) -> None:
        super().__init__(retention)
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        with self.batch():
            migrate(lambda sql, args: self._all(sql, args), "sqlite", str(path))

    def _db(self) -> sqlite3.Connection:
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.row_factory = sqlite3.Row
            self._local.db = db
            self._connections.append(db)
        return db

    def _execute(self, sql: str, args: Sequence[Any] = (), at_once: bool = False) -> Any:
        return self._db().execute(sql, tuple(args))

    def location(self) -> str:
        return str(self.path)

    def batch(self) -> Batch:
        db = self._db()
        return Batch("BEGIN IMMEDIATE", db.in_transaction, db.execute)

    def close(self) -> None:
        for db in self._connections:
            db.close()
        self._connections.clear()
        self._local = threading.local()

    def lease(self) -> FileLease:
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

