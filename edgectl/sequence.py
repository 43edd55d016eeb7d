"""Monotonic sequence numbers for signed controller messages (desired state, commands)."""

from __future__ import annotations

import fcntl
import time
from collections.abc import Callable
from pathlib import Path

from edgectl.home import edgectl_home

__all__ = ["next_sequence", "raise_sequence_floor"]


def next_sequence(path: Path | None = None) -> int:
    """max(now in ms, last + 1), persisted under a file lock so parallel edgectl runs never repeat one.

    Time-based numbers stay monotonic across workstations whose clocks agree, and across a
    wiped $EDGECTL_HOME, which a plain counter would not."""
    return _update(path, lambda last: max(int(time.time() * 1000), last + 1))


def raise_sequence_floor(floor: int, path: Path | None = None) -> None:
    """Never issue a number at or below ``floor`` from now on.

    A controller that takes over the engine lease calls this with the highest number the store
    knows was sent: the previous leader, on another host, may have counted ahead of this clock
    during a burst, and devices refuse a number they have already passed."""
    _update(path, lambda last: max(last, floor))


def _update(path: Path | None, step: Callable[[int], int]) -> int:
    path = path or edgectl_home() / "sequence"
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        text = f.read().strip()
        value = step(int(text) if text.isdigit() else 0)
        f.seek(0)
        f.truncate()
        f.write(str(value))
        f.flush()
    return value
