"""The controller's inbox: what devices publish, bounded before anything is parsed.

paho's network thread puts every received message here. :meth:`Inbox.put` looks at the payload's
length only (no parsing, no blocking: a callback that blocks starves keepalive) and drops:

- a payload over its leaf's limit (``oversized``): the broker caps messages too (docs/security.md,
  "Broker limits"), this holds on a broker configured without that cap;
- telemetry once the bytes waiting exceed ``budget_bytes``, and anything once they exceed twice
  that (``overflow``): a flood costs the controller at most that much memory. Reports lost this way
  are recovered from each device's retained ``state`` (see ``Reports.on_state``).

Every drop is counted in :class:`Drops` (shared with the ingest, which adds ``identity`` drops) and
logged at the 1st, 10th, 100th, ... of each kind, so a flood cannot flood the log as well.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
from dataclasses import dataclass, field

from agent.protocol.chunks import PACKET_OVERHEAD
from agent.transport import Message

__all__ = ["Drops", "Inbox", "InboxLimits"]

log = logging.getLogger(__name__)

KIB = 1024


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
    """A queue of received messages that refuses oversized payloads and stays within a byte budget."""

    def __init__(self, limits: InboxLimits | None = None, drops: Drops | None = None) -> None:
        super().__init__()
        self.limits = limits or InboxLimits()
        self.drops = drops or Drops()
        self.waiting_bytes = 0
        self._bytes_lock = threading.Lock()

    def put(self, item: Message, block: bool = True, timeout: float | None = None) -> None:
        size, limit = len(item.payload), self.limits.limit(item.topic)
        if size > limit:
            return self.drops.count("oversized", item.topic, f"{size} bytes over the {limit} byte limit")
        with self._bytes_lock:
            waiting = self.waiting_bytes + size
            budget = self.limits.budget_bytes
            if waiting > 2 * budget or (waiting > budget and item.topic.endswith("/telemetry")):
                full = True
            else:
                full, self.waiting_bytes = False, waiting
        if full:
            return self.drops.count("overflow", item.topic, f"{self.waiting_bytes} bytes already wait to be ingested")
        super().put(item, block, timeout)

    def get(self, block: bool = True, timeout: float | None = None) -> Message:
        item = super().get(block, timeout)
        with self._bytes_lock:
            self.waiting_bytes -= len(item.payload)
        return item


def _power_of_ten(n: int) -> bool:
    while n % 10 == 0:
        n //= 10
    return n == 1
