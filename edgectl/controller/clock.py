"""One clock for every controller replica: the store's, read once a tick and carried by a monotonic clock between reads.

The engine's timers (bake, wave timeout, pacing, the silence gate) and the times at which reports
are received are all read here, so replicas whose wall clocks disagree (by an hour, say) still
agree on how long a wave baked and how long a device was silent. Between two reads the time moves
with this process's monotonic clock, which no clock adjustment moves; a read that fails (the store
is down) leaves the last one in force.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["StoreClock"]


class StoreClock:
    """``clock()`` is the store's time now; ``at(t)`` the store's time at an earlier ``time.monotonic()`` reading ``t``."""

    def __init__(self, read: Callable[[], float], monotonic: Callable[[], float] = time.monotonic) -> None:
        self.read, self.monotonic = read, monotonic
        self._base: tuple[float, float] | None = None  # (store time, monotonic time) of the last read

    def sync(self) -> None:
        """Read the store's clock now (raises what the read raises; the previous reading stays in force)."""
        before = self.monotonic()
        store_now = self.read()
        self._base = (store_now, (before + self.monotonic()) / 2)  # the read happened about half-way

    def at(self, monotonic_t: float) -> float:
        if self._base is None:
            self.sync()
        assert self._base is not None
        return self._base[0] + (monotonic_t - self._base[1])

    def __call__(self) -> float:
        return self.at(self.monotonic())
