"""A bounded pool of PostgreSQL connections, shared by every thread of one process.

At most ``size`` connections are open at once, whatever the number of threads that ask (API
workers, the controller's loop): a caller that finds none free waits up to ``wait_s`` for one, then
gets :class:`StoreUnavailable` (the API answers 503) rather than a new session. A connection that
broke (the server restarted, the network dropped) is discarded, never handed out again; the next
caller opens a fresh one. Connections come in kinds (``db``: batches and reads; ``observed``:
device writes at once, without waiting for the disk) and are reused only within their kind; a caller
that finds no free slot while a connection of another kind sits idle closes that one and takes its
slot (else a pool full of idle ``db`` connections stalled every ``observed`` write for ``wait_s``,
then failed it).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

from edgectl.controller.store.protocol import StoreUnavailable

__all__ = ["ConnectionPool"]


class ConnectionPool:
    """``take(kind)`` a connection, ``give`` it back when done, ``discard`` it when it broke."""

    def __init__(self, connect: Callable[[str], Any], size: int, wait_s: float, where: str) -> None:
        self.connect, self.size, self.wait_s, self.where = connect, size, wait_s, where
        self._idle: dict[str, list[Any]] = {}
        self._every: list[Any] = []  # every open connection, idle or in use
        self._connecting = 0
        self._cond = threading.Condition()

    @property
    def open_count(self) -> int:
        with self._cond:
            return len(self._every)

    def take(self, kind: str) -> Any:
        deadline = time.monotonic() + self.wait_s
        spare: Any = None  # an idle connection of another kind whose slot this caller takes
        with self._cond:
            while True:
                idle = self._idle.setdefault(kind, [])
                while idle:
                    conn = idle.pop()
                    if not (conn.closed or conn.broken):
                        return conn
                    self._forget(conn)
                if len(self._every) + self._connecting < self.size:
                    self._connecting += 1  # the slot is held while connecting, outside the lock
                    break
                spare = self._idle_of_another(kind)
                if spare is not None:  # its slot, freed: closed outside the lock, then connected as below
                    self._forget(spare)
                    self._connecting += 1
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StoreUnavailable(f"the store {self.where} has all {self.size} connections of this process in use; "
                                           "retry")
                self._cond.wait(left)
        if spare is not None:
            _close(spare)
        try:
            conn = self.connect(kind)
        except BaseException:
            with self._cond:
                self._connecting -= 1
                self._cond.notify()
            raise
        with self._cond:
            self._connecting -= 1
            self._every.append(conn)
        return conn

    def _idle_of_another(self, kind: str) -> Any | None:
        """Under the lock: the idle connection of another kind that waited longest (taken off its list), or None."""
        for other, idle in self._idle.items():
            if other != kind and idle:
                return idle.pop(0)  # the list is taken from its end: its start waited longest
        return None

    def give(self, conn: Any, kind: str, keep: bool) -> None:
        """Back to the idle list (``keep``: it is healthy and outside any transaction), else closed."""
        with self._cond:
            if keep and not (conn.closed or conn.broken):
                self._idle.setdefault(kind, []).append(conn)
                self._cond.notify()
                return
            self._forget(conn)
        _close(conn)

    def discard(self, conn: Any) -> None:
        with self._cond:
            self._forget(conn)
        _close(conn)

    def drop_idle(self) -> None:
        """Close every idle connection (one broke: the server restarted or the network dropped; the others are suspect)."""
        with self._cond:
            idle = [conn for kind in self._idle.values() for conn in kind]
            self._idle = {}
            for conn in idle:
                self._forget(conn)
        for conn in idle:
            _close(conn)

    def close(self) -> None:
        with self._cond:
            every, self._every, self._idle = self._every, [], {}
            self._cond.notify_all()
        for conn in every:
            _close(conn)

    def _forget(self, conn: Any) -> None:
        """Under the lock: the connection no longer counts against the size."""
        if conn in self._every:
            self._every.remove(conn)
        self._cond.notify()


def _close(conn: Any) -> None:
    with contextlib.suppress(Exception):  # a connection that broke: closing it is all that is left, and it may fail too
        conn.close()
