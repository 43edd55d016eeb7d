"""Choose the backend by measuring it: check outputs against a reference, time, pick the fastest.

The measurement (``agent.measure``: load each candidate, refuse it if its accelerator took no or
few nodes, compare its outputs on the golden inputs, time those that pass in a contest,
``agent.timing``) runs in a child process (``agent.measure_child``), so a runtime that crashes on
the model fails its candidate and never the agent; only a backend registry passed in explicitly
(a test's or an embedder's, which a child cannot rebuild) is measured in this process. The decision
is cached in a JSON file keyed by the model's sha256, the hardware fingerprint, the runtime
versions and the candidate list; any change re-measures.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agent.catalog import Candidate, candidate_backends, runtime_versions
from agent.hardware import Hardware
from agent.measure import Figure, Measured, Status, measure_candidates
from agent.measure_child import CHILD_TIMEOUT_S, measure_in_child
from agent.timing import Budget, Decision
from edgecore.backends import BackendRegistry, Runner
from edgecore.durable import atomic_write_json
from edgecore.errors import OperationFailed, VerificationError
from edgecore.protocol.package import sha256_file
from edgecore.tensors import TOLERANCES, model_precision

__all__ = [
    "TOLERANCE",
    "Decision",
    "Figure",
    "Selection",
    "Status",
    "measure_backends",
    "model_precision",
    "save_selection",
    "select_backend",
]

log = logging.getLogger(__name__)

# Largest allowed max|got - want| / max|want| per model precision (the policy lives in edgecore.tensors).
TOLERANCE = {precision: tolerance.relative for precision, tolerance in TOLERANCES.items()}
_SCHEMA = 1


@dataclass(frozen=True)
class Selection:
    """The chosen backend for one model on one device, with every candidate's figures.

    ``open()`` returns a NEW, not yet activated runner of the chosen backend: use it in a
    ``with`` block or hand it to ``ModelRegistry.publish``, which activates it.
    """

    model_path: Path
    model_sha256: str
    candidate: Candidate
    figures: tuple[Figure, ...]
    key: str
    precision: str
    cached: bool = False
    measured_at: float = field(default_factory=time.time)
    decision: Decision | None = None  # None in cache files written before the decision was recorded

    @property
    def backend(self) -> str:
        """The chosen runner's name, e.g. ``openvino/CPU``."""
        return self.candidate.name

    def open(self) -> Runner:
        """A new, inactive runner of the chosen backend."""
        return self.candidate.open(self.model_path)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form for the cache, telemetry and ``edge-agent probe``."""
        data = {
            "schema": _SCHEMA,
            "key": self.key,
            "model": str(self.model_path),
            "model_sha256": self.model_sha256,
            "backend": self.backend,
            "candidate": self.candidate.to_dict(),
            "precision": self.precision,
            "measured_at": self.measured_at,
            "cached": self.cached,
            "figures": [f.to_dict() for f in self.figures],
        }
        if self.decision is not None:
            data["decision"] = self.decision.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], model_path: Path, cached: bool = True) -> Selection:
        """Inverse of ``to_dict`` (the model path is where the model is now, not where it was)."""
        return cls(
            model_path=model_path,
            model_sha256=str(data["model_sha256"]),
            candidate=Candidate.from_dict(data["candidate"]),
            figures=tuple(Figure.from_dict(f) for f in data["figures"]),
            key=str(data["key"]),
            precision=str(data.get("precision", "fp32")),
            cached=cached,
            measured_at=float(data["measured_at"]),
            decision=Decision.from_dict(data["decision"]) if data.get("decision") else None,
        )


def select_backend(
    model_path: Path,
    *,
    hardware: Hardware,
    allowed_providers: Sequence[str] | None,
    golden: Mapping[str, np.ndarray] | None,
    expected: Mapping[str, np.ndarray] | None,
    cache_dir: Path,
    time_budget_s: float = 5.0,
    remeasure: bool = False,
    candidates: Sequence[Candidate] | None = None,
    precision: str | None = None,
    progress: Callable[[str], None] | None = None,
    registry: BackendRegistry | None = None,
) -> Selection:
    """The cached decision for ``model_path`` on this hardware, or ``measure_backends`` afresh (then cached).

    ``remeasure`` measures even when a decision is cached; the other arguments are those of
    ``measure_backends``.
    """
    model_path = Path(model_path)
    sha = sha256_file(model_path)
    if candidates is None:
        candidates = candidate_backends(hardware, allowed_providers, registry=registry)
    if not remeasure:
        cached = _load_cached(_cache_file(cache_dir, sha), _cache_key(sha, hardware, candidates, registry), model_path)
        if cached is not None:
            return cached
    selection = measure_backends(model_path, hardware=hardware, allowed_providers=allowed_providers, golden=golden,
                                 expected=expected, time_budget_s=time_budget_s, candidates=candidates,
                                 precision=precision, progress=progress, registry=registry)
    save_selection(cache_dir, selection)
    return selection


def measure_backends(
    model_path: Path,
    *,
    hardware: Hardware,
    allowed_providers: Sequence[str] | None,
    golden: Mapping[str, np.ndarray] | None,
    expected: Mapping[str, np.ndarray] | None,
    time_budget_s: float = 5.0,
    candidates: Sequence[Candidate] | None = None,
    precision: str | None = None,
    progress: Callable[[str], None] | None = None,
    registry: BackendRegistry | None = None,
    keep_going: Callable[[], bool] | None = None,
    nice: int = 0,
) -> Selection:
    """Measure the candidates for ``model_path`` on this hardware and return the fastest that passes (not cached).

    The contest (``agent.timing``) keeps measuring for at most ``time_budget_s`` while it cannot
    tell the candidates apart (at least ``MIN_ROUNDS`` rounds whatever the budget);
    ``Selection.decision`` says which rule decided. ``candidates`` overrides the list derived from
    hardware and installed runtimes; ``precision`` (fp32, fp16, int8) overrides the one read from
    the model; ``registry`` is the backend registry to open candidates from (given, the measurement
    runs in this process). ``keep_going`` (checked while the child measures; false stops it:
    ``measure_child.Stopped``) and ``nice`` (the child's priority) serve background re-measurement.
    """
    model_path = Path(model_path)
    sha = sha256_file(model_path)
    if candidates is None:
        candidates = candidate_backends(hardware, allowed_providers, registry=registry)
    if not candidates:
        raise VerificationError(
            f"{model_path.name}: no backend on this device matches the allowed providers {list(allowed_providers or [])}"
        )
    precision = precision or model_precision(model_path)
    budget = Budget(time_budget_s)
    measured: Measured
    if registry is None:
        measured = measure_in_child(model_path, candidates, golden, expected, precision, budget, progress=progress,
                                    keep_going=keep_going, timeout_s=CHILD_TIMEOUT_S, nice=nice)
    else:
        measured = measure_candidates(model_path, candidates, golden, expected, precision, budget, progress=progress,
                                      registry=registry)
    if measured.winner is None or measured.decision is None:
        reasons = "; ".join(f"{f.backend}: {f.reason}" for f in measured.figures)
        raise OperationFailed(f"{model_path.name}: no backend passed: {reasons}")
    chosen = measured.figures[measured.winner]
    selection = Selection(model_path, sha, chosen.candidate, measured.figures,
                          _cache_key(sha, hardware, candidates, registry), precision, decision=measured.decision)
    log.info("%s: chose %s (%.3f ms median; %s)", model_path.name, chosen.candidate.name, chosen.median_ms or 0.0,
             measured.decision.describe())
    return selection


def save_selection(cache_dir: Path, selection: Selection) -> None:
    """Cache ``selection`` atomically (temp file, fsync, rename, fsync directory) for its model."""
    atomic_write_json(_cache_file(cache_dir, selection.model_sha256), {**selection.to_dict(), "cached": False})


def _cache_file(cache_dir: Path, sha: str) -> Path:
    return Path(cache_dir) / f"selection-{sha[:16]}.json"


def _cache_key(sha: str, hardware: Hardware, candidates: Sequence[Candidate], registry: BackendRegistry | None) -> str:
    blob = {
        "schema": _SCHEMA,
        "model_sha256": sha,
        "hardware": hardware.fingerprint(),
        "runtimes": runtime_versions(registry),
        "candidates": [c.to_dict() for c in candidates],
    }
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()


def _load_cached(cache_file: Path, key: str, model_path: Path) -> Selection | None:
    """The cached decision when its key still matches; a corrupt file just means re-measure."""
    try:
        data = json.loads(cache_file.read_text())
        if data.get("key") != key:
            return None
        return Selection.from_dict(data, model_path)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
