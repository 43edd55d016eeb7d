"""A deadline kept by another thread: a blocking read that stalls is cut from outside.

A socket timeout bounds one ``recv``, not a response: a source that drips a byte a second, or
sends ``100 Continue`` forever, never trips it. The fetch arms the watchdog before each step (a
response head, a chunk) with the time that step may take; when the deadline passes first, the
watchdog records why and calls ``on_fire`` (which shuts the socket down), and the blocked read
fails at once. Moving the deadline forward costs a lock and no wake-up: the thread only looks
again when the deadline it waits for is due.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["Watchdog"]


class Watchdog:
    """Calls ``on_fire`` once an armed deadline passes; ``fired`` says which step it cut (None: none)."""

    def __init__(self, on_fire: Callable[[], None]) -> None:
        self._on_fire = on_fire
        self._cond = threading.Condition()
        self._deadline: float | None = None
        self._reason = ""
        self._closed = False
        self.fired: str | None = None
        self._thread = threading.Thread(target=self._run, name="fetch-watchdog", daemon=True)
        self._thread.start()

    def arm(self, seconds: float, reason: str) -> None:
        """The next step must end within ``seconds``; ``reason`` is what ``fired`` says if it does not."""
        with self._cond:
            deadline = time.monotonic() + seconds
            sooner = self._deadline is None or deadline < self._deadline
            self._deadline, self._reason, self.fired = deadline, reason, None
            if sooner:
                self._cond.notify()

    def disarm(self) -> None:
        with self._cond:
            self._deadline = None

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                if self._deadline is None:
                    self._cond.wait()
                    continue
                left = self._deadline - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                self.fired, self._deadline = self._reason, None
                self._on_fire()
