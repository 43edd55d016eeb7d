"""The engine lease: exactly one controller drives rollouts; the others ingest and stand by.

- :class:`FileLease` (SQLite): an exclusive ``flock`` beside the store file. SQLite allows one
  controller, so a second one is refused at start with one line naming the holder's pid.
- :class:`AdvisoryLease` (PostgreSQL): ``pg_try_advisory_lock`` on a dedicated connection. The lock
  lives as long as that session: a killed leader's session ends with its socket and a standby takes
  the lock at its next check. TCP keepalives (about 10 s) end a session whose peer vanished.

:class:`Leadership` re-checks the lease on every tick; the service publishes nothing while it does
not lead (``leading`` is read before every publish), so a leader that lost its lease goes quiet at
once.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from agent.errors import ConfigError

__all__ = ["ENGINE_LOCK", "AdvisoryLease", "FileLease", "Leadership"]

log = logging.getLogger(__name__)

ENGINE_LOCK = 0x6564676563746C  # "edgectl" as a bigint: the advisory lock key of the engine lease


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

    def release(self) -> None:
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None


class AdvisoryLease:
    """A PostgreSQL session-level advisory lock held on its own connection."""

    replicated = True

    def __init__(self, conninfo: str, where: str, key: int = ENGINE_LOCK) -> None:
        self.conninfo, self.where, self.key = conninfo, where, key
        self._conn: Any = None
        self._held = False

    def check(self) -> bool:
        import psycopg

        try:
            if self._conn is None or self._conn.closed:
                self._held = False
                self._conn = psycopg.connect(self.conninfo, autocommit=True, connect_timeout=5, keepalives=1,
                                             keepalives_idle=5, keepalives_interval=2, keepalives_count=3,
                                             options="-c statement_timeout=5000")
            if not self._held:
                self._held = bool(self._conn.execute("SELECT pg_try_advisory_lock(%s)", (self.key,)).fetchone()[0])
            else:  # still our session, and the lock with it
                self._held = bool(self._conn.execute(
                    "SELECT EXISTS(SELECT 1 FROM pg_locks WHERE locktype='advisory' AND granted AND pid=pg_backend_pid() "
                    "AND classid=%s AND objid=%s)", (self.key >> 32, self.key & 0xFFFFFFFF)).fetchone()[0])
        except psycopg.Error as exc:
            log.warning("engine lease on %s: %s", self.where, str(exc).strip().splitlines()[0] if str(exc).strip() else exc)
            self.release()
        return self._held

    def release(self) -> None:
        self._held = False
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # a broken connection: closing it is all that is left to do
                log.debug("closing the lease connection failed", exc_info=True)


class Leadership:
    """Whether this controller leads now: ``check()`` every tick, ``leading`` before every publish."""

    def __init__(self, lease: Any, on_gain: Callable[[], None] = lambda: None) -> None:
        self.lease = lease
        self.on_gain = on_gain
        self._leading = threading.Event()

    @property
    def leading(self) -> bool:
        return self._leading.is_set()

    @property
    def replicated(self) -> bool:
        return bool(self.lease.replicated)

    def check(self) -> bool:
        """Take or keep the lease; on a change, log it (and run ``on_gain`` when this controller starts leading)."""
        now = bool(self.lease.check())
        if now and not self.leading:
            self._leading.set()
            log.info("leading: this controller drives the rollouts")
            self.on_gain()
        elif not now and self.leading:
            self._leading.clear()
            log.warning("lost the engine lease: standing by, publishing nothing")
        return now

    def release(self) -> None:
        self._leading.clear()
        self.lease.release()
