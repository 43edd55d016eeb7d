"""A thread that hands every message of a transport's inbox to a handler: the harnesses' controller side."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

from edgecore.transport import Message

__all__ = ["InboxPump"]


class InboxPump:
    """Calls ``handle`` with each message ``inbox`` receives, on its own thread, until ``close``."""

    def __init__(self, inbox: queue.Queue[Message], handle: Callable[[Message], None], name: str = "inbox-pump") -> None:
        self.inbox = inbox
        self.handle = handle
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                message = self.inbox.get(timeout=0.1)
            except queue.Empty:
                continue
            self.handle(message)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
