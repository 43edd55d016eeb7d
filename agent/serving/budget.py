"""The byte budget: memory held by the requests in flight, over HTTP and gRPC together."""

from __future__ import annotations

import threading

__all__ = ["ByteBudget"]


class ByteBudget:
    """Bytes held by requests in flight, capped; thread-safe (workers release)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._lock = threading.Lock()

    def try_reserve(self, amount: int) -> bool:
        """Reserve ``amount`` bytes if they fit under the limit."""
        with self._lock:
            if self.used + amount > self.limit:
                return False
            self.used += amount
            return True

    def release(self, amount: int) -> None:
        """Give back what try_reserve took."""
        with self._lock:
            self.used -= amount
