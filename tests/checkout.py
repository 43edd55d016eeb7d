"""This checkout: its root, and the environment that makes Python subprocesses import its code.

A subprocess started as ``python -m edgectl.cli.main`` from another directory would otherwise
import whatever the interpreter has installed (an editable install may point at another
checkout), so a suite run from a second checkout would test the first one's agent and CLI.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["REPO", "checkout_env"]

REPO = Path(__file__).resolve().parents[1]


def checkout_env(base: Mapping[str, str] | None = None, /, **extra: str) -> dict[str, str]:
    """``base`` (default: this process's environment) plus ``extra``, with this checkout first on PYTHONPATH."""
    env = {**(os.environ if base is None else base), **extra}
    kept = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != REPO]
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *kept])
    return env
