"""Where edgectl keeps its per-user state (keys, embedded-broker registration, controller store)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["edgectl_home"]


def edgectl_home() -> Path:
    """``$EDGECTL_HOME``, else ``~/.edgectl``; created on first use with mode 0700."""
    home = Path(os.environ.get("EDGECTL_HOME") or Path.home() / ".edgectl")
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    return home
