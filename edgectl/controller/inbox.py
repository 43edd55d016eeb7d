"""The controller's inbox: what devices publish, bounded before anything is parsed.

paho's network thread puts every received message here, and the inbox notes when (this process's
monotonic clock: ingest orders reports by when the controller received them). :meth:`Inbox.put`
looks at the payload's length only (no parsing, no blocking: a callback that blocks starves
keepalive) and drops:

- a payload over its leaf's limit (``oversized``): the broker caps messages too (docs/security.md,
  "Broker limits"), this holds on a broker configured without that cap;
- the **oldest telemetry** waiting, as long as the bytes waiting would exceed ``budget_bytes``
  (``overflow``); a new telemetry report that still does not fit, and any other report once twice
  the budget is waiting, are dropped too (``overflow``). A flood, or a store that is down while
  devices keep reporting, costs the controller at most that much memory, and what it keeps is the
  newest telemetry and every event, birth, presence and state it can. Reports lost this way are
  recovered from each device's retained ``state`` (see ``Reports.on_state`` and the reconciliation).

A batch the store could not take goes back to the front (:meth:`Inbox.putback`), in its order.
Every drop is counted in :class:`Drops` (shared with the ingest, which adds ``identity`` drops) and
logged at the 1st, 10th, 100th, ... of each kind, so a flood cannot flood the log as well.
"""

from __future__ import annotations

import collections
import itertools
import logging
import queue
import threading
import time
from dataclasses import dataclass, field

from edgecore.protocol.chunks import PACKET_OVERHEAD
from edgecore.transport import Message

__all__ = ["Drops", "Inbox", "InboxLimits", "Received"]

log = logging.getLogger(__name__)

KIB = 1024
TELEMETRY = "/telemetry"


@dataclass(frozen=True)
class InboxLimits:
    """Per-leaf payload limits (bytes) and the budget of bytes waiting to be ingested."""

    leaves: dict[str, int] = field(default_factory=lambda: {
        "presence": 4 * KIB, "birth": 64 * KIB, "state": 256 * KIB, "events": 256 * KIB, "telemetry": 256 * KIB,
        "chunk-requests": 64 * KIB,
    })
    other: int = 64 * KIB + PACKET_OVERHEAD
    budget_bytes: int = 64 * 1024 * KIB

    def limit(self, topic: str) -> int:
        return self.leaves.get(topic.rsplit("/", 1)[-1], self.other)


@dataclass(frozen=True)
class Received:
    """A message and when this process received it (``time.monotonic()``)."""

    message: Message
    at: float
    seq: int = 0  # arrival order, kept when a batch goes back to the front


class Drops:
    """Messages dropped unparsed or refused, by reason (``oversized``, ``overflow``, ``identity``)."""

    def __init__(self) -> None:
        self._counts: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    def count(self, reason: str, topic: str, detail: str) -> None:
        with self._lock:
            self._counts[reason] += 1
            n = self._counts[reason]
        if _power_of_ten(n):
            log.warning("dropped %s message #%d on %s: %s", reason, n, topic, detail)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def __getitem__(self, reason: str) -> int:
        with self._lock:
            return self._counts[reason]


class Inbox(queue.Queue[Message]):
    """Received messages in arrival order, telemetry apart so the oldest of it can go first; within a byte budget."""

    def __init__(self, limits: InboxLimits | None = None, drops: Drops | None = None) -> None:
        super().__init__()
        self.limits = limits or InboxLimits()
        self.drops = drops or Drops()
        self.waiting_bytes = 0
        self.evicted = 0  # telemetry reports dropped to make room for newer ones (also counted as overflow)

    # -- queue.Queue's storage hooks (called with its mutex held) ---------------------------------

    def _init(self, maxsize: int) -> None:
        self._reports: collections.deque[Received] = collections.deque()
        self._telemetry: collections.deque[Received] = collections.deque()
        self._order = itertools.count()

    def _qsize(self) -> int:
        return len(self._reports) + len(self._telemetry)

    def _put(self, item: Message) -> None:
        received = Received(item, time.monotonic(), next(self._order))
        (self._telemetry if item.topic.endswith(TELEMETRY) else self._reports).append(received)

    def _get(self) -> Message:
        return self._take().message

    def _take(self) -> Received:
        """The earliest arrival of either kind."""
        if not self._telemetry or (self._reports and self._reports[0].seq < self._telemetry[0].seq):
            received = self._reports.popleft()
        else:
            received = self._telemetry.popleft()
        self.waiting_bytes -= len(received.message.payload)
        return received

    # -- what the transport and the controller call -----------------------------------------------

    def put(self, item: Message, block: bool = True, timeout: float | None = None) -> None:
        size, limit = len(item.payload), self.limits.limit(item.topic)
        if size > limit:
            return self.drops.count("oversized", item.topic, f"{size} bytes over the {limit} byte limit")
        with self.mutex:
            if not self._make_room(item, size):
                return self.drops.count("overflow", item.topic, f"{self.waiting_bytes} bytes already wait to be ingested")
            self.waiting_bytes += size
            self._put(item)
            self.unfinished_tasks += 1
            self.not_empty.notify()

    def _make_room(self, item: Message, size: int) -> bool:
        """Under the mutex: drop the oldest telemetry until ``item`` fits the budget; whether it may be kept."""
        budget = self.limits.budget_bytes
        while self.waiting_bytes + size > budget and self._telemetry:
            gone = self._telemetry.popleft()
            self.waiting_bytes -= len(gone.message.payload)
            self.evicted += 1
            self.drops.count("overflow", gone.message.topic, "the oldest telemetry waiting, dropped to make room")
        if self.waiting_bytes + size <= budget:
            return True
        return not item.topic.endswith(TELEMETRY) and self.waiting_bytes + size <= 2 * budget

    def get_received(self, timeout: float) -> Received:
        """The next message with its receive time; ``queue.Empty`` after ``timeout`` seconds without one."""
        deadline = time.monotonic() + timeout
        with self.not_empty:
            while not self._qsize():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise queue.Empty
                self.not_empty.wait(left)
            received = self._take()
            self.not_full.notify()
            return received

    def putback(self, batch: list[Received]) -> None:
        """A batch the store could not take goes back in front of what arrived since, in its order, within the budget."""
        with self.mutex:
            for received in reversed(batch):
                message = received.message
                (self._telemetry if message.topic.endswith(TELEMETRY) else self._reports).appendleft(received)
                self.waiting_bytes += len(message.payload)
            self._make_room(Message("", b"", False), 0)
            if batch:
                self.not_empty.notify()


def _power_of_ten(n: int) -> bool:
    while n % 10 == 0:
        n //= 10
    return n == 1
