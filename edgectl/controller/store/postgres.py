"""The store in PostgreSQL: one database for several controller replicas (``postgresql://...``).

psycopg 3, autocommit connections per thread from one bounded pool (``pool.py``): a batch is an
explicit ``BEGIN``/``COMMIT``. Device observations (presence, birth, state, telemetry, and a
telemetry report's history point and latency figures) and events are written at once on a second
connection, outside any batch: each replica receives them, the writes are idempotent (kept once per
report or event by a unique key) or ordered by the time the controller received them, and a
one-statement write holds its row lock for that statement only, so replicas never deadlock on each
other's batches. A thread that releases the store (an API request thread) hands its connections back to
the pool for the next thread. Packages are kept in the database (every replica reads them) and
cached as files under ``packages_dir``. JSON fields of the text columns are read with
``column::jsonb #>> '{path}'``.

Every session asks the server to end it when its peer vanishes or stalls: TCP keepalives and
``tcp_user_timeout`` on both ends, and ``idle_in_transaction_session_timeout``, so a controller
frozen or cut off mid-transaction releases its locks within seconds. The driver's errors are
translated at :meth:`PostgresStore._run`: an unreachable, restarting or read-only server is
:class:`StoreUnavailable`, and a broken connection is discarded, never reused.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgecore.errors import ConfigError
from edgectl.controller.store.migrations import MIGRATE_LOCK, migrate
from edgectl.controller.store.pool import ConnectionPool
from edgectl.controller.store.protocol import ENGINE_LEASE, Fenced, LeaseToken, Retention, StoreUnavailable
from edgectl.controller.store.sql import Batch, SqlStore

if TYPE_CHECKING:
    from edgectl.controller.leader import TableLease

__all__ = ["POOL_SIZE", "SESSION_OPTIONS", "PostgresStore", "redacted"]

POOL_SIZE = 24  # connections one process opens at most (the API's workers hold two each, the controller two)
POOL_WAIT_S = 5.0  # how long a thread waits for a free connection before the store counts as unavailable
# Server side: end a session whose client vanished (keepalives), whose sent data stays unacknowledged,
# or that sits in a transaction without a statement (a frozen controller), within seconds.
SESSION_OPTIONS = ("-c tcp_keepalives_idle=5 -c tcp_keepalives_interval=2 -c tcp_keepalives_count=2 "
                   "-c tcp_user_timeout=8000 -c idle_in_transaction_session_timeout=5000")
# Client side, likewise: a server that vanished fails the next statement within seconds.
CLIENT_KEEPALIVES: dict[str, Any] = {"keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2,
                                     "keepalives_count": 2, "tcp_user_timeout": 8000}
TAG_KEYS = ("SELECT DISTINCT jsonb_object_keys(birth::jsonb -> 'tags') AS key FROM devices "
            "WHERE jsonb_typeof(birth::jsonb -> 'tags') = 'object'")
LAGS = ("SELECT telemetry_ts - (telemetry::jsonb ->> 'ts')::double precision AS lag FROM devices "
        "WHERE telemetry_ts >= ? AND jsonb_typeof(telemetry::jsonb -> 'ts') = 'number'")
FENCE = ("SELECT holder, epoch, expires > extract(epoch FROM clock_timestamp()) AS live FROM leases WHERE name=? "
         "FOR KEY SHARE")


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


def session_options(url: str, extra: str = "") -> str:
    """The server options of a session: the URL's own ``options``, then ours."""
    from psycopg.conninfo import conninfo_to_dict

    own = str(conninfo_to_dict(url).get("options") or "")
    return " ".join(part for part in (own, SESSION_OPTIONS, extra) if part)


class PostgresStore(SqlStore):
    """The store in one PostgreSQL database."""

    rowid = "id"
    like = "ILIKE"  # SQLite's LIKE ignores ASCII case; so does the console's search on either engine

    def __init__(self, url: str, packages_dir: Path, retention: Retention | None = None, pool_size: int = POOL_SIZE) -> None:
        try:
            import psycopg
        except ImportError:
            raise ConfigError("a postgresql:// store needs psycopg: pip install 'edgectl[postgres]'") from None
        super().__init__(retention)
        self.url = url
        self.packages_dir = packages_dir
        # What the server or the network did, not what this code asked: the store is unavailable.
        self._unavailable = (psycopg.OperationalError, psycopg.InterfaceError, psycopg.errors.ReadOnlySqlTransaction,
                             psycopg.errors.IdleInTransactionSessionTimeout)
        self._errors = psycopg.Error
        self._local = threading.local()
        self._pool = ConnectionPool(self._connect, pool_size, POOL_WAIT_S, self.location())
        with self.batch():
            self._execute("SELECT pg_advisory_xact_lock(?)", (MIGRATE_LOCK,))
            migrate(lambda sql, args: self._all(sql, args), "postgres", self.location())

    def _connect(self, kind: str) -> Any:
        import psycopg
        from psycopg.rows import dict_row

        # Observations are re-sent by devices (retained, periodic): losing the last ones in a
        # database crash costs nothing (the telemetry history a point per device at most), so their
        # commits do not wait for the disk.
        extra = "-c synchronous_commit=off" if kind == "observed" else ""
        try:
            return psycopg.connect(self.url, autocommit=True, row_factory=dict_row, connect_timeout=5,
                                   options=session_options(self.url, extra), **CLIENT_KEEPALIVES)
        except psycopg.Error as exc:
            raise StoreUnavailable(f"cannot connect to the PostgreSQL store {self.location()}: {_reason(exc)}") from None

    def _db(self, at_once: bool = False) -> Any:
        kind = "observed" if at_once else "db"
        conn = getattr(self._local, kind, None)
        if conn is not None and (conn.closed or conn.broken):
            if getattr(self._local, "pinned", None) is conn:  # never carry on a batch on another connection
                raise StoreUnavailable(f"the connection to the PostgreSQL store {self.location()} broke mid-transaction")
            self._forget(conn, kind)
            conn = None
        if conn is None:
            conn = self._pool.take(kind)
            setattr(self._local, kind, conn)
        return conn

    def _forget(self, conn: Any, kind: str) -> None:
        if getattr(self._local, kind, None) is conn:
            setattr(self._local, kind, None)
        self._pool.discard(conn)

    def release(self) -> None:
        from psycopg.pq import TransactionStatus

        for kind in ("db", "observed"):
            conn = getattr(self._local, kind, None)
            if conn is not None:
                setattr(self._local, kind, None)
                idle = not (conn.closed or conn.broken) and conn.info.transaction_status == TransactionStatus.IDLE
                self._pool.give(conn, kind, keep=idle)

    def _execute(self, sql: str, args: Sequence[Any] = (), at_once: bool = False) -> Any:
        kind = "observed" if at_once else "db"
        return self._run(self._db(at_once), kind, _pg(sql), tuple(args))

    def _run(self, conn: Any, kind: str, sql: str, args: tuple[Any, ...] = ()) -> Any:
        """One statement on ``conn``; the driver's errors translated (see the module docstring)."""
        try:
            return conn.execute(sql, args)
        except self._errors as exc:
            broken = conn.closed or conn.broken
            if broken:
                self._forget(conn, kind)
                self._pool.drop_idle()  # opened before the same failure, most likely: none is handed out again
            if broken or isinstance(exc, self._unavailable):
                raise StoreUnavailable(f"the PostgreSQL store {self.location()} is unavailable: {_reason(exc)}") from exc
            raise

    def location(self) -> str:
        return redacted(self.url)

    def batch(self) -> Batch:
        from psycopg.pq import TransactionStatus

        db = self._db()
        nested = db.info.transaction_status != TransactionStatus.IDLE
        if not nested:
            self._local.pinned = db

        def end() -> None:
            self._local.pinned = None
            self._local.fenced = False

        return Batch("BEGIN", nested, lambda sql: self._run(db, "db", sql), end)

    def connections(self) -> int:
        return self._pool.open_count

    def close(self) -> None:
        self._pool.close()
        self._local = threading.local()

    # -- clock, health and fencing ----------------------------------------------------------------

    def now(self) -> float:
        return float(self._all("SELECT extract(epoch FROM clock_timestamp())::double precision AS now")[0]["now"])

    def ping(self) -> None:
        # Both of this thread's connections: one kept from before an outage (the server restarted) fails here,
        # and is replaced, rather than on the first write after the store "answered again".
        self._execute("SELECT 1", at_once=True)
        read_only = self._all("SELECT current_setting('transaction_read_only') AS ro")[0]["ro"]
        if read_only == "on":
            raise StoreUnavailable(f"the PostgreSQL store {self.location()} is read-only now (it takes no writes)")

    def _check_fence(self, token: LeaseToken) -> None:
        """The lease row, locked against a take-over until this transaction ends: still ours, and not expired."""
        if getattr(self._local, "fenced", False):
            return  # checked already in this transaction, whose lock still holds
        rows = self._all(FENCE, (ENGINE_LEASE,))
        if not rows or rows[0]["holder"] != token.holder or rows[0]["epoch"] != token.epoch or not rows[0]["live"]:
            now = f"epoch {rows[0]['epoch']} held by {rows[0]['holder'] or 'nobody'}" if rows else "no lease"
            raise Fenced(f"engine lease epoch {token.epoch} is no longer current ({now}): nothing written")
        self._local.fenced = True

    # -- JSON in PostgreSQL -----------------------------------------------------------------------

    def _json(self, column: str, path: str) -> str:
        return f"({column}::jsonb #>> '{{{path.replace('.', ',')}}}')"

    def _json_tag(self, key: str) -> tuple[str, str]:
        return "(birth::jsonb -> 'tags' ->> CAST(? AS TEXT))", key

    def _tag_keys_sql(self) -> str:
        return TAG_KEYS

    def _lags_sql(self) -> str:
        return LAGS

    def lease(self) -> TableLease:
        from edgectl.controller.leader import TableLease  # the leader module reads this store's protocol

        return TableLease(self.url, self.location())

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

    def discard_package(self, variant: str) -> bool:
        """The entry and the database's copy; the cached file here (other replicas' caches keep theirs, unread)."""
        with self.batch():
            listed = self._unlist_package(variant)
            self._execute("DELETE FROM package_files WHERE variant=?", (variant,))
        (self.packages_dir / f"{variant}.edgepkg").unlink(missing_ok=True)
        return listed

    def _cached(self, variant: str, write: Any) -> Path:
        self.packages_dir.mkdir(parents=True, exist_ok=True)
        path = self.packages_dir / f"{variant}.edgepkg"
        if not path.exists():
            partial = path.with_name(f"{path.name}.{threading.get_ident()}.part")
            write(partial)
            partial.replace(path)
        return path


def _reason(exc: BaseException) -> str:
    """The server's or libpq's own words (their last line names the cause), never a password."""
    primary = getattr(getattr(exc, "diag", None), "message_primary", None)  # the server's own words, without
    if primary:  # the LINE/caret lines psycopg adds after them
        return str(primary)
    text = str(exc).strip()
    return text.splitlines()[-1].strip() if text else type(exc).__name__
