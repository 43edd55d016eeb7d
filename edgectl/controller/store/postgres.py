"""The store in PostgreSQL: one database for several controller replicas (``postgresql://...``).

psycopg 3, autocommit connections per thread: a batch is an explicit ``BEGIN``/``COMMIT``. Device
observations (presence, birth, state, telemetry) and events are written at once on a second
connection, outside any batch: each replica receives them, the writes are idempotent or ordered by
the device's own time, and a one-statement write holds its row lock for that statement only, so
replicas never deadlock on each other's batches. A thread that releases the store (an API request
thread) leaves its connections in a small idle pool for the next thread. Packages are kept in the
database (every replica reads them) and cached as files under ``packages_dir``. JSON fields of the
text columns are read with ``column::jsonb #>> '{path}'``.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from agent.errors import ConfigError
from edgectl.controller.leader import AdvisoryLease
from edgectl.controller.store.migrations import MIGRATE_LOCK, migrate
from edgectl.controller.store.protocol import Retention
from edgectl.controller.store.sql import IDLE_CONNECTIONS, Batch, SqlStore

__all__ = ["PostgresStore", "redacted"]

CONNECTIONS = ("db", "observed")  # per thread: batches and reads; observations written at once
TAG_KEYS = ("SELECT DISTINCT jsonb_object_keys(birth::jsonb -> 'tags') AS key FROM devices "
            "WHERE jsonb_typeof(birth::jsonb -> 'tags') = 'object'")
LAGS = ("SELECT telemetry_ts - (telemetry::jsonb ->> 'ts')::double precision AS lag FROM devices "
        "WHERE telemetry_ts >= ? AND jsonb_typeof(telemetry::jsonb -> 'ts') = 'number'")


@lru_cache(maxsize=256)
def _pg(sql: str) -> str:
    return sql.replace("%", "%%").replace("?", "%s")


def redacted(url: str) -> str:
    """The URL without its password, for logs and the audit log."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        parts = conninfo_to_dict(url)
    except Exception:  # not parseable: say nothing of it
        return "postgresql://?"
    user = f"{parts['user']}@" if parts.get("user") else ""
    port = f":{parts['port']}" if parts.get("port") else ""
    return f"postgresql://{user}{parts.get('host') or ''}{port}/{parts.get('dbname') or ''}"


class PostgresStore(SqlStore):
    """The store in one PostgreSQL database."""

    rowid = "id"
    like = "ILIKE"  # SQLite's LIKE ignores ASCII case; so does the console's search on either engine

    def __init__(self, url: str, packages_dir: Path, retention: Retention | None = None) -> None:
        try:
            import psycopg  # noqa: F401  (the optional dependency: say how to get it)
        except ImportError:
            raise ConfigError("a postgresql:// store needs psycopg: pip install 'edgectl[postgres]'") from None
        super().__init__(retention)
        self.url = url
        self.packages_dir = packages_dir
        self._local = threading.local()
        self._connections: list[Any] = []
        self._idle: dict[str, list[Any]] = {name: [] for name in CONNECTIONS}
        self._lock = threading.Lock()
        with self.batch():
            self._execute("SELECT pg_advisory_xact_lock(?)", (MIGRATE_LOCK,))
            migrate(lambda sql, args: self._all(sql, args), "postgres", self.location())

    def _connect(self, synchronous: bool) -> Any:
        import psycopg
        from psycopg.rows import dict_row

        try:
            conn = psycopg.connect(self.url, autocommit=True, row_factory=dict_row, connect_timeout=10,
                                   options="" if synchronous else "-c synchronous_commit=off")
        except psycopg.OperationalError as exc:
            reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
            raise ConfigError(f"cannot connect to the PostgreSQL store {self.location()}: {reason}") from None
        with self._lock:
            self._connections.append(conn)
        return conn

    def _db(self, at_once: bool = False) -> Any:
        name = "observed" if at_once else "db"
        conn = getattr(self._local, name, None)
        if conn is None or conn.closed:
            conn = self._reuse(name)
        if conn is None:
            # Observations are re-sent by devices (retained, periodic): losing the last ones in a
            # database crash costs nothing, so their commits do not wait for the disk.
            conn = self._connect(synchronous=not at_once)
            setattr(self._local, name, conn)
        return conn

    def _reuse(self, name: str) -> Any:
        with self._lock:
            while self._idle[name]:
                conn = self._idle[name].pop()
                if not conn.closed:
                    setattr(self._local, name, conn)
                    return conn
        return None

    def release(self) -> None:
        from psycopg.pq import TransactionStatus

        for name in CONNECTIONS:
            conn = getattr(self._local, name, None)
            if conn is None:
                continue
            setattr(self._local, name, None)
            with self._lock:
                if not conn.closed and conn.info.transaction_status == TransactionStatus.IDLE \
                        and len(self._idle[name]) < IDLE_CONNECTIONS:
                    self._idle[name].append(conn)
                    continue
                if conn in self._connections:
                    self._connections.remove(conn)
            conn.close()

    def _execute(self, sql: str, args: Sequence[Any] = (), at_once: bool = False) -> Any:
        return self._db(at_once).execute(_pg(sql), tuple(args))

    def location(self) -> str:
        return redacted(self.url)

    def batch(self) -> Batch:
        from psycopg.pq import TransactionStatus

        db = self._db()
        return Batch("BEGIN", db.info.transaction_status != TransactionStatus.IDLE, db.execute)

    def close(self) -> None:
        with self._lock:
            connections, self._connections = self._connections, []
            self._idle = {name: [] for name in CONNECTIONS}
        for conn in connections:
            conn.close()
        self._local = threading.local()

    # -- JSON in PostgreSQL -----------------------------------------------------------------------

    def _json(self, column: str, path: str) -> str:
        return f"({column}::jsonb #>> '{{{path.replace('.', ',')}}}')"

    def _json_tag(self, key: str) -> tuple[str, str]:
        return "(birth::jsonb -> 'tags' ->> CAST(? AS TEXT))", key

    def _tag_keys_sql(self) -> str:
        return TAG_KEYS

    def _lags_sql(self) -> str:
        return LAGS

    def lease(self) -> AdvisoryLease:
        return AdvisoryLease(self.url, self.location())

    def keep_package(self, variant: str, source: Path) -> Path:
        """In the database (every replica reads it there) and as a file here."""
        data = source.read_bytes()
        self._execute("INSERT INTO package_files(variant, data, size) VALUES (?,?,?) ON CONFLICT(variant) DO NOTHING",
                      (variant, data, len(data)))
        return self._cached(variant, lambda path: shutil.copyfile(source, path))

    def package_file(self, variant: str, recorded: Path) -> Path:
        if recorded.is_file():
            return recorded
        rows = self._all("SELECT data FROM package_files WHERE variant=?", (variant,))
        if not rows:
            raise ConfigError(f"package {variant[:12]} is not in the store {self.location()}")
        return self._cached(variant, lambda path: path.write_bytes(bytes(rows[0]["data"])))

    def _cached(self, variant: str, write: Any) -> Path:
        self.packages_dir.mkdir(parents=True, exist_ok=True)
        path = self.packages_dir / f"{variant}.edgepkg"
        if not path.exists():
            partial = path.with_name(f"{path.name}.{threading.get_ident()}.part")
            write(partial)
            partial.replace(path)
        return path
