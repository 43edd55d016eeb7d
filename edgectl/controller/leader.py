"""The engine lease: exactly one controller drives rollouts; the others ingest and stand by.

- :class:`FileLease` (SQLite): an exclusive ``flock`` beside the store file. SQLite allows one
  controller, so a second one is refused at start with one line naming the holder's pid.
- :class:`TableLease` (PostgreSQL): the row ``engine`` of the ``leases`` table, with an expiry on
  the database's clock (:data:`LEASE_TTL_S` after the last renewal) and a fencing number, ``epoch``,
  raised by one at every take-over. A leader renews it at every tick; whatever its process or host
  does (killed, frozen, cut off), the lease lapses within the TTL and a standby takes it, and sooner
  when the holder's database session has ended (a killed process). The store refuses any engine
  write whose epoch is not the current, unexpired one (``Store.fenced``), so a deposed leader that
  wakes up writes nothing; and it publishes nothing, because it counts its own lease as lapsed
  :data:`LEASE_TTL_S` (less a margin) after it *asked* for the last renewal, on its monotonic clock,
  which runs on while a process is stopped.

:class:`Leadership` re-checks the lease on every tick; the service publishes nothing while it does
not lead (``leading`` is read before every publish).
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from edgecore.errors import ConfigError
from edgectl.controller.store.protocol import ENGINE_LEASE, Lease, LeaseToken

__all__ = ["ENGINE_LEASE", "LEASE_TTL_S", "FileLease", "Leadership", "TableLease"]

log = logging.getLogger(__name__)

LEASE_TTL_S = 5.0  # a lease not renewed for this long lapses (database clock): the failover bound, with a tick
MARGIN_S = 0.5  # a holder stops trusting its lease this much before the database would let it go
NOW = "extract(epoch FROM clock_timestamp())"
READ = (f"SELECT holder, epoch, expires, {NOW} AS now, "
        "(holder_pid IS NULL OR NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = holder_pid)) AS gone "
        "FROM leases WHERE name = %s")
TAKE = (f"UPDATE leases SET holder = %s, epoch = epoch + 1, expires = {NOW} + %s, holder_pid = pg_backend_pid() "
        "WHERE name = %s RETURNING epoch")
RENEW = (f"UPDATE leases SET expires = {NOW} + %s, holder_pid = pg_backend_pid() "
         "WHERE name = %s AND holder = %s AND epoch = %s RETURNING epoch")
GIVE_UP = "UPDATE leases SET expires = 0, holder_pid = NULL WHERE name = %s AND holder = %s AND epoch = %s"


class FileLease:
    """One controller per SQLite file: an exclusive ``flock`` that the kernel drops when the process dies."""

    replicated = False

    def __init__(self, store_path: Path) -> None:
        self.store_path = store_path
        self.path = store_path.with_name(store_path.name + ".controller.lock")
        self._file: IO[str] | None = None

    def check(self) -> bool:
        if self._file is not None:
            return True
        f = self.path.open("a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "?"
            f.close()
            raise ConfigError(f"another controller (pid {holder}) runs on the SQLite store {self.store_path}: "
                              "SQLite allows one controller; use a postgresql:// store for replicas") from None
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        self._file = f
        return True

    def token(self) -> LeaseToken | None:
        return LeaseToken(f"pid {os.getpid()}", 0) if self._file is not None else None

    def release(self) -> None:
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None


class TableLease:
    """The ``engine`` row of the ``leases`` table, taken and renewed on a connection of its own."""

    replicated = True

    def __init__(self, conninfo: str, where: str, ttl_s: float = LEASE_TTL_S,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.conninfo, self.where, self.ttl_s, self.monotonic = conninfo, where, ttl_s, monotonic
        self.holder = f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:6]}"
        self._conn: Any = None
        self._epoch: int | None = None
        self._valid_until = 0.0  # on this process's monotonic clock

    def token(self) -> LeaseToken | None:
        epoch = self._epoch
        if epoch is None or self.monotonic() >= self._valid_until:
            return None
        return LeaseToken(self.holder, epoch)

    def check(self) -> bool:
        import psycopg

        for fresh in (False, True):
            try:
                if self._epoch is not None:
                    self._renew()
                if self._epoch is None:
                    self._take()
                break
            except psycopg.Error as exc:
                # A connection the server ended while idle (it restarted) fails its first statement: once more
                # on a new one, so a store that is back does not cost the lease for a tick.
                stale = not fresh and self._conn is not None and bool(self._conn.broken or self._conn.closed)
                self._close()
                if not stale:
                    log.warning("engine lease on %s: %s", self.where, _reason(exc))
                    break
        return self.token() is not None

    def _renew(self) -> None:
        asked = self.monotonic()
        row = self._connection().execute(RENEW, (self.ttl_s, ENGINE_LEASE, self.holder, self._epoch)).fetchone()
        if row is None:
            log.warning("the engine lease (epoch %s) passed to another controller", self._epoch)
            self._epoch = None
            return
        self._valid_until = asked + self.ttl_s - MARGIN_S

    def _take(self) -> None:
        """Take the lease if it lapsed or its holder's session ended; a row lock keeps two standbys from both taking it."""
        import psycopg

        conn = self._connection()
        row = conn.execute(READ, (ENGINE_LEASE,)).fetchone()
        if row is None or (row[2] > row[3] and not row[4]):
            return  # held (or the migration has not run yet)
        asked = self.monotonic()
        try:
            with conn.transaction():
                conn.execute("SET LOCAL lock_timeout = '1s'")  # a leader's fenced write holds the row for a statement
                locked = conn.execute(READ + " FOR UPDATE", (ENGINE_LEASE,)).fetchone()
                if locked is None or (locked[2] > locked[3] and not locked[4]):
                    return
                taken = conn.execute(TAKE, (self.holder, self.ttl_s, ENGINE_LEASE)).fetchone()
        except psycopg.errors.LockNotAvailable:
            return
        self._epoch, self._valid_until = int(taken[0]), asked + self.ttl_s - MARGIN_S
        log.info("took the engine lease on %s (epoch %d; it was %s)", self.where, self._epoch,
                 "free" if not row[0] else f"{row[0]}'s, " + ("whose session ended" if row[4] else "lapsed"))

    def _connection(self) -> Any:
        import psycopg

        from edgectl.controller.store.postgres import CLIENT_KEEPALIVES, session_options

        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = psycopg.connect(self.conninfo, autocommit=True, connect_timeout=3,
                                         options=session_options(self.conninfo, "-c statement_timeout=3000"),
                                         **CLIENT_KEEPALIVES)
        return self._conn

    @property
    def epoch(self) -> int | None:
        return self._epoch

    def release(self) -> None:
        """Give the lease up at once (a clean stop): a standby need not wait for it to lapse."""
        import psycopg

        if self._epoch is not None and self._conn is not None and not self._conn.closed:
            try:
                self._conn.execute(GIVE_UP, (ENGINE_LEASE, self.holder, self._epoch))
            except psycopg.Error as exc:
                log.debug("giving the lease up failed (it lapses instead): %s", exc)
        self._epoch = None
        self._close()

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # a broken connection: closing it is all that is left to do
                log.debug("closing the lease connection failed", exc_info=True)


class Leadership:
    """Whether this controller leads now: ``check()`` every tick, ``leading`` before every publish."""

    def __init__(self, lease: Lease, on_gain: Callable[[], None] = lambda: None,
                 on_loss: Callable[[], None] = lambda: None) -> None:
        self.lease = lease
        self.on_gain, self.on_loss = on_gain, on_loss
        self._leading = threading.Event()

    @property
    def leading(self) -> bool:
        """Leading, and the lease certainly still held now (a process frozen past its TTL is not)."""
        return self._leading.is_set() and self.lease.token() is not None

    @property
    def replicated(self) -> bool:
        return bool(self.lease.replicated)

    def token(self) -> LeaseToken | None:
        """The token every engine write carries (``Store.fenced``); None while not leading."""
        return self.lease.token() if self._leading.is_set() else None

    def check(self) -> bool:
        """Take or keep the lease; on a change, log it and run ``on_gain`` or ``on_loss``."""
        now = bool(self.lease.check())
        if now and not self._leading.is_set():
            self._leading.set()
            log.info("leading: this controller drives the rollouts")
            self.on_gain()
        elif not now and self._leading.is_set():
            self._leading.clear()
            log.warning("lost the engine lease: standing by, publishing nothing")
            self.on_loss()
        return now

    def release(self) -> None:
        self._leading.clear()
        self.lease.release()


def _reason(exc: BaseException) -> str:
    primary = getattr(getattr(exc, "diag", None), "message_primary", None)  # the server's own words, without
    if primary:  # the LINE/caret lines psycopg adds after them
        return str(primary)
    text = str(exc).strip()
    return text.splitlines()[-1].strip() if text else type(exc).__name__
