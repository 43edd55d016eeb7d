"""Choose the backend by measuring it: check outputs against a reference, time, pick the fastest.

For each candidate: skip it when its declaration does not run the model's precision, load it,
refuse it if its accelerator took no or few nodes (that is CPU in disguise), compare its outputs on
the golden inputs with the expected outputs (or, without them, with the registry's reference
device, onnxruntime's CPU provider) by the model's precision (``agent.tensors``). The candidates
that pass are timed in interleaved blocks until one is faster beyond the noise, or found a tie
that a fixed rule resolves (``agent.timing``). The decision is cached in a JSON file keyed by the
model's sha256, the hardware fingerprint, the runtime versions and the candidate list; any change
re-measures.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np

from agent.backends import (
    BackendRegistry,
    Candidate,
    Placement,
    Runner,
    candidate_backends,
    reference_candidate,
    runtime_versions,
)
from agent.durable import atomic_write_json
from agent.errors import EdgeError, ModelError, OperationFailed, VerificationError, one_line
from agent.footprint import footprint_mb
from agent.hardware import Hardware
from agent.protocol.package import sha256_file
from agent.tensors import TOLERANCES, compare_outputs, model_precision, synthetic_feeds
from agent.timing import Contest, Decision, contest

__all__ = ["TOLERANCE", "Decision", "Figure", "Selection", "Status", "model_precision", "select_backend"]

log = logging.getLogger(__name__)

# Largest allowed max|got - want| / max|want| per model precision (the policy lives in agent.tensors).
TOLERANCE = {precision: tolerance.relative for precision, tolerance in TOLERANCES.items()}
_SCHEMA = 1
SETTLE_S = 0.01  # idle before each timed block: OpenVINO ran 2x slower right after an onnxruntime run than 0.2 s later


class Status(str, Enum):
    """A candidate's outcome: passed and timed, refused by a check, or unable to load or run."""

    OK = "ok"
    REJECTED = "rejected"
    FAILED = "failed"


@dataclass(frozen=True)
class Figure:
    """One candidate's measurement; fields it never reached stay None (and out of ``to_dict``)."""

    backend: str
    options: Mapping[str, str]
    status: Status
    reason: str = ""
    load_ms: float | None = None
    placement: Placement | None = None
    max_rel_error: float | None = None
    runs: int | None = None
    median_ms: float | None = None
    p95_ms: float | None = None
    memory_mb: float | None = None
    chosen: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", Status(self.status))

    @property
    def candidate(self) -> Candidate:
        """The candidate this figure measured."""
        backend, _, device = self.backend.partition("/")
        return Candidate(backend, device, dict(self.options))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, as cached, reported in telemetry and printed by ``edge-agent probe``."""
        data: dict[str, Any] = {"backend": self.backend, "options": dict(self.options), "status": self.status.value}
        if self.reason:
            data["reason"] = self.reason
        if self.placement is not None:
            data["placement"] = self.placement.to_dict()
        for key in ("load_ms", "max_rel_error", "runs", "median_ms", "p95_ms", "memory_mb"):
            if getattr(self, key) is not None:
                data[key] = getattr(self, key)
        data["chosen"] = self.chosen
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Figure:
        """Inverse of ``to_dict``; reads every cache file written since schema 1."""

        def number(key: str, kind: type[float] | type[int]) -> Any:
            return kind(data[key]) if data.get(key) is not None else None

        placement = data.get("placement")
        return cls(
            backend=str(data["backend"]), options={str(k): str(v) for k, v in dict(data.get("options", {})).items()},
            status=Status(data["status"]), reason=str(data.get("reason", "")), load_ms=number("load_ms", float),
            placement=Placement.from_dict(placement) if placement else None,
            max_rel_error=number("max_rel_error", float), runs=number("runs", int),
            median_ms=number("median_ms", float), p95_ms=number("p95_ms", float),
            memory_mb=number("memory_mb", float), chosen=bool(data.get("chosen", False)),
        )


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
    """Measure the candidates for ``model_path`` on this hardware and return the fastest that passes.

    The fastest is decided by ``agent.timing.contest`` within ``time_budget_s`` (at least
    ``MIN_ROUNDS`` rounds whatever the budget); a tie goes by the fixed rule recorded in
    ``Selection.decision``.

    ``candidates`` overrides the list derived from hardware and installed runtimes;
    ``precision`` (fp32, fp16, int8) overrides the one read from the model; ``registry`` is the
    backend registry to open candidates from (the process-wide one by default).
    """
    model_path = Path(model_path)
    sha = sha256_file(model_path)
    if candidates is None:
        candidates = candidate_backends(hardware, allowed_providers, registry=registry)
    if not candidates:
        raise VerificationError(
            f"{model_path.name}: no backend on this device matches the allowed providers {list(allowed_providers or [])}"
        )
    key = _cache_key(sha, hardware, candidates, registry)
    cache_file = Path(cache_dir) / f"selection-{sha[:16]}.json"
    if not remeasure:
        cached = _load_cached(cache_file, key, model_path)
        if cached is not None:
            return cached
    precision = precision or model_precision(model_path)
    figures, decided = _measure(model_path, list(candidates), golden, expected, precision, time_budget_s, progress,
                                registry)
    if decided is None:
        reasons = "; ".join(f"{f.backend}: {f.reason}" for f in figures)
        raise OperationFailed(f"{model_path.name}: no backend passed: {reasons}")
    best, decision = decided
    figures = [replace(f, chosen=i == best) for i, f in enumerate(figures)]
    chosen = figures[best].candidate
    selection = Selection(model_path, sha, chosen, tuple(figures), key, precision, decision=decision)
    _save(cache_file, selection)
    log.info("%s: chose %s (%.3f ms median; %s)", model_path.name, chosen.name, figures[best].median_ms or 0.0,
             _why(decision))
    return selection


def _why(decision: Decision) -> str:
    if decision.runner_up is None:
        return "the only candidate that passed"
    against = f"{decision.runner_up} {decision.ratio:.3f}x [{decision.low or 0:.3f}, {decision.high or 0:.3f}]"
    return f"{'tie, by ' + decision.rule if decision.tie else 'faster'} than {against} over {decision.blocks} blocks"


def _measure(
    model_path: Path,
    candidates: list[Candidate],
    golden: Mapping[str, np.ndarray] | None,
    expected: Mapping[str, np.ndarray] | None,
    precision: str,
    budget_s: float,
    progress: Callable[[str], None] | None,
    registry: BackendRegistry | None,
) -> tuple[list[Figure], tuple[int, Decision] | None]:
    """Figures for every candidate (load, verify placement and outputs, time), and the chosen figure's index with
    the decision (None: none passed)."""
    feeds, want = _reference(model_path, golden, expected)
    figures: list[Figure] = []
    active: list[tuple[Runner, int]] = []
    try:
        for cand in candidates:
            if progress:
                progress(f"checking {cand.name}")
            fig, runner = _qualify(cand, model_path, feeds, want, precision, registry)
            figures.append(fig)
            if runner is not None:
                active.append((runner, len(figures) - 1))
        if not active:
            return figures, None
        if progress:
            progress(f"timing {len(active)} backend(s) in interleaved blocks for about {budget_s:g} s")
        result = _time(model_path, active, figures, feeds, budget_s, progress, registry)
        for slot, ((_, index), timing) in enumerate(zip(active, result.timings, strict=True)):
            ms = np.array(timing.samples) * 1000.0
            figures[index] = replace(figures[index], runs=len(ms), median_ms=round(float(np.median(ms)), 4),
                                     p95_ms=round(float(np.percentile(ms, 95)), 4), memory_mb=result.memory_mb.get(slot))
    finally:
        for runner, _ in active:
            runner.close()
    return figures, (active[result.winner][1], result.decision)


def _time(model_path: Path, active: list[tuple[Runner, int]], figures: list[Figure], feeds: dict[str, np.ndarray],
          budget_s: float, progress: Callable[[str], None] | None, registry: BackendRegistry | None) -> Contest:
    """The contest between the active runners, timed on the real runtimes; memory measured in a child if a tie asks."""

    def run_block(index: int, runs: int) -> list[float]:
        runner = active[index][0]
        time.sleep(SETTLE_S)  # the runtime timed just before may still spin its threads (onnxruntime does)
        if runs > 1:  # uncounted, for the same reason
            runner.infer(feeds, check=False)
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            runner.infer(feeds, check=False)
            times.append(time.perf_counter() - start)
        return times

    def memory(index: int) -> float | None:
        if registry is not None:  # the child process only knows the process-wide registry
            return None
        if progress:
            progress(f"tie: measuring the memory of {figures[active[index][1]].backend}")
        return footprint_mb(figures[active[index][1]].candidate, model_path, feeds)

    names = [_label(figures[index]) for _, index in active]
    return contest(names, run_block, budget_s=budget_s, memory=memory, progress=progress)


def _label(fig: Figure) -> str:
    """The backend's name, with its options when it has any (CoreML's two model formats share one name)."""
    options = ",".join(f"{k}={v}" for k, v in sorted(fig.options.items()))
    return f"{fig.backend}[{options}]" if options else fig.backend


def _reference(
    model_path: Path, golden: Mapping[str, np.ndarray] | None, expected: Mapping[str, np.ndarray] | None
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Golden feeds (synthetic when absent) and the outputs every candidate must reproduce."""
    if golden is not None and expected is not None:
        return dict(golden), dict(expected)
    with reference_candidate().open(model_path) as ref:
        feeds = dict(golden) if golden is not None else synthetic_feeds(ref.inputs)
        try:
            return feeds, ref.infer(feeds)
        except EdgeError as exc:
            raise ModelError(f"{model_path.name}: the reference backend cannot run the golden inputs: {exc}") from exc
        except Exception as exc:  # onnxruntime's own errors, e.g. a generated value out of range
            raise ModelError(
                f"{model_path.name}: the reference backend failed on {'golden' if golden else 'generated'} inputs "
                f"(pass golden inputs): {exc}"
            ) from exc


def _qualify(
    cand: Candidate, model_path: Path, feeds: dict[str, np.ndarray], want: dict[str, Any], precision: str,
    registry: BackendRegistry | None,
) -> tuple[Figure, Runner | None]:
    """Load one candidate and check placement and outputs; the runner stays active if it passed."""
    fig = Figure(cand.name, dict(cand.options), Status.FAILED)
    declared = cand.declaration(registry)
    if declared is not None and precision not in declared.precisions:
        why = f"{cand.name} does not run {precision} models (only {', '.join(declared.precisions)})"
        return replace(fig, status=Status.REJECTED, reason=why), None
    runner = cand.open(model_path, registry)
    try:
        start = time.perf_counter()
        runner.activate()
        placement = runner.placement
        fig = replace(fig, load_ms=round((time.perf_counter() - start) * 1000, 2), placement=placement)
        if not placement.accelerated:
            runner.close()
            return replace(fig, status=Status.REJECTED, reason=_fallback_reason(placement)), None
        check = compare_outputs(runner.infer(feeds), want, precision)
        fig = replace(fig, max_rel_error=check.max_rel_error)
        if check.problem:
            runner.close()
            return replace(fig, status=Status.REJECTED, reason=check.problem), None
        return replace(fig, status=Status.OK), runner
    except Exception as exc:  # a backend that cannot load or run this model is just not a candidate
        runner.close()
        return replace(fig, reason=one_line(exc)), None


def _fallback_reason(placement: Placement) -> str:
    taken = (placement.nodes or {}).get(placement.requested, 0)
    total = placement.total_nodes if placement.total_nodes is not None else "?"
    return f"{placement.requested} took {taken}/{total} nodes: it would run on {placement.effective}"


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


def _save(cache_file: Path, selection: Selection) -> None:
    """Write the decision atomically (temp file, fsync, rename, fsync directory)."""
    atomic_write_json(cache_file, {**selection.to_dict(), "cached": False})
