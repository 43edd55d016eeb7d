"""How much memory a backend takes to hold and run a model, measured in a fresh child process.

In the agent's own process the figure would depend on what was loaded before (a runtime's
libraries and plugins, memory the allocator kept from an earlier model): the same candidate
measured 30 to 170 MiB from one selection to the next. A child that imports the runtime, notes
its resident memory, then loads the model and runs one inference gives the same figure every time.
Backend selection asks for it to break a tie (``agent.timing.resolve_tie``); staging measures it
the same way on the reference device (``agent.deploy.stage``), and a deployment on the serving
backend after the pick. :class:`FootprintBook` keeps what was measured, per model file and backend,
for the device's admission (``agent.admission``) and its state report.

Child protocol: ``python -m agent.footprint CANDIDATE_JSON MODEL FEEDS_NPZ`` prints ``{"mb": float}``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from agent.catalog import Candidate
from edgecore.durable import atomic_write_json, read_json
from edgecore.protocol.manifest import Manifest

log = logging.getLogger(__name__)

__all__ = ["FootprintBook", "footprint_key", "footprint_mb", "rss_mb"]


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


def footprint_key(manifest: Manifest) -> str:
    """What figures are kept under: a model's file (sha256[:16], as its selection), a pipeline's payload."""
    sha = manifest.payload.sha256 if manifest.is_pipeline else manifest.file(manifest.model).sha256
    return sha[:16]


class FootprintBook:
    """``<state>/footprints.json``: resident MiB per model (``footprint_key``) and backend, for the models on the device.

    Bounded: the sweep keeps the keys of the active and previous models only (``prune``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def _read(self) -> dict[str, dict[str, float]]:
        raw = read_json(self.path)
        figures = raw.get("figures") if isinstance(raw, dict) else None
        if not isinstance(figures, dict):
            return {}
        return {str(k): {str(b): float(mb) for b, mb in v.items() if isinstance(mb, int | float)}
                for k, v in figures.items() if isinstance(v, dict)}

    def get(self, key: str) -> dict[str, float]:
        """Backend -> MiB measured for this model (empty when never measured here)."""
        return self._read().get(key, {})

    def record(self, key: str, figures: Mapping[str, float]) -> None:
        """Keep ``figures`` (backend -> MiB) for ``key``; a write that fails loses only the figure (logged)."""
        with self._lock:
            book = self._read()
            book[key] = {**book.get(key, {}), **figures}
            self._save(book)

    def prune(self, keep: set[str]) -> list[str]:
        """Forget every model but ``keep``; returns the keys dropped."""
        with self._lock:
            book = self._read()
            gone = sorted(set(book) - keep)
            if gone:
                self._save({k: v for k, v in book.items() if k in keep})
            return gone

    def _save(self, book: dict[str, dict[str, float]]) -> None:
        try:
            atomic_write_json(self.path, {"schema": 1, "figures": book})
        except OSError as exc:
            log.warning("cannot save the measured footprints: %s", exc.strerror or exc)


def rss_mb() -> float:
    """This process's resident memory in MiB."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def main(argv: list[str]) -> None:
    candidate = Candidate.from_dict(json.loads(argv[0]))
    with np.load(argv[2], allow_pickle=False) as data:
        feeds = {name: data[name] for name in data.files}
    runner = candidate.open(Path(argv[1]))
    with contextlib.suppress(ImportError):  # a backend not named after its module: its import counts, always alike
        __import__(candidate.backend)  # the runtime's own libraries are not the model's footprint
    before = rss_mb()
    with runner:
        runner.infer(feeds, check=False)
        after = rss_mb()
    print(json.dumps({"mb": round(max(after - before, 0.0), 1)}))


if __name__ == "__main__":
    main(sys.argv[1:])
