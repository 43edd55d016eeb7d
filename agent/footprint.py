"""How much memory a backend takes to hold and run a model, measured in a fresh child process.

In the agent's own process the figure would depend on what was loaded before (a runtime's
libraries and plugins, memory the allocator kept from an earlier model): the same candidate
measured 30 to 170 MiB from one selection to the next. A child that imports the runtime, notes
its resident memory, then loads the model and runs one inference gives the same figure every time.
Backend selection asks for it only to break a tie (``agent.timing.resolve_tie``).

Child protocol: ``python -m agent.footprint CANDIDATE_JSON MODEL FEEDS_NPZ`` prints ``{"mb": float}``.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from agent.backends import Candidate

__all__ = ["footprint_mb"]


def footprint_mb(candidate: Candidate, model_path: Path, feeds: Mapping[str, np.ndarray],
                 timeout_s: float = 60.0) -> float | None:
    """Resident MiB that loading ``model_path`` on ``candidate`` and one inference add; None when unknown."""
    with tempfile.TemporaryDirectory(prefix="footprint-") as tmp:
        feeds_file = Path(tmp) / "feeds.npz"
        arrays: dict[str, Any] = {name: np.asarray(value) for name, value in feeds.items()}
        np.savez(feeds_file, allow_pickle=False, **arrays)
        argv = [sys.executable, "-m", "agent.footprint", json.dumps(candidate.to_dict()), str(model_path), str(feeds_file)]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
            return float(json.loads(proc.stdout.strip().splitlines()[-1])["mb"])
        except (subprocess.TimeoutExpired, OSError, ValueError, IndexError, KeyError, TypeError):
            return None  # a tie then goes to the next rule


def _rss_mb() -> float:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def main(argv: list[str]) -> None:
    candidate = Candidate.from_dict(json.loads(argv[0]))
    with np.load(argv[2], allow_pickle=False) as data:
        feeds = {name: data[name] for name in data.files}
    runner = candidate.open(Path(argv[1]))
    with contextlib.suppress(ImportError):  # a backend not named after its module: its import counts, always alike
        __import__(candidate.backend)  # the runtime's own libraries are not the model's footprint
    before = _rss_mb()
    with runner:
        runner.infer(feeds, check=False)
        after = _rss_mb()
    print(json.dumps({"mb": round(max(after - before, 0.0), 1)}))


if __name__ == "__main__":
    main(sys.argv[1:])
