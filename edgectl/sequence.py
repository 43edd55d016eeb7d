"""Monotonic sequence numbers for signed controller messages (desired state, commands)."""

from __future__ import annotations

import fcntl
import time
from pathlib import Path

from edgectl.home import edgectl_home

__all__ = ["next_sequence"]


def next_sequence(path: Path | None = None) -> int:
    """max(now in ms, last + 1), persisted under a file lock so parallel edgectl runs never repeat one.

    Time-based numbers stay monotonic across workstations whose clocks agree, and across a
    wiped $EDGECTL_HOME, which a plain counter would not."""
    path = path or edgectl_home() / "sequence"
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        text = f.read().strip()
        last = int(text) if text.isdigit() else 0
        seq = max(int(time.time() * 1000), last + 1)
        f.seek(0)
        f.truncate()
        f.write(str(seq))
        f.flush()
    return seq
