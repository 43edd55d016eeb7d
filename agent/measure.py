"""Measure the candidate backends of one model: the reference outputs, each candidate's checks, the timing contest.

For each candidate: skip it when its declaration does not run the model's precision, load it,
refuse it if its accelerator took no or few nodes (that is CPU in disguise), compare its outputs on
the golden inputs with the expected outputs (or, without them, with the registry's reference
device, onnxruntime's CPU provider) by the model's precision (``edgecore.tensors``). The candidates
that pass are timed against each other (``agent.timing.contest``).

**Golden inputs, never noise where the input has structure.** Without golden inputs the
candidates could only be compared on synthetic noise, which says nothing about accuracy unless
noise is a fair sample of the model's input: ``input_structure`` decides that. Where the input has
structure, only the reference device itself is taken as right; every other candidate is
``unverified`` (loaded and placed, never compared on noise, never chosen) until golden inputs are
given (a package's golden data, ``edge-agent probe --golden DIR``).

This runs in whichever process calls it; ``agent.measure_child`` runs it in a child process, and
``watch`` is how the child says what it is about to do, so that a crash names its candidate.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np

from agent.catalog import Candidate, reference_candidate
from agent.footprint import footprint_mb
from agent.timing import Budget, Contest, Decision, contest
from edgecore.backends import BackendRegistry, Placement, Runner, TensorSpec
from edgecore.errors import EdgeError, ModelError, one_line
from edgecore.tensors import compare_outputs, synthetic_feeds

__all__ = ["REFERENCE", "Figure", "Measured", "Status", "Watch", "input_structure", "measure_candidates"]

# Before each timed block, wait until this process's threads are idle: onnxruntime's pool spins for 60-70 ms after
# its last run (36 ms of CPU time while this process slept, at a load average of 8 on 2 cores), and OpenVINO timed
# meanwhile ran 10-30% slower than alone; OpenVINO's own pool uses ~1% of a core once idle. Two calm steps in a
# row, because under load a spinning thread may be off the CPU for a whole step.
SETTLE_STEP_S = 0.005
SETTLE_MAX_S = 0.25
SETTLE_BUSY = 0.05  # calm: the process used less than this share of one core over a step
SETTLE_CALM_STEPS = 2
REFERENCE = -1  # the index ``watch`` gives the reference device's run
GOLDEN_HINT = "golden data in the package, or edge-agent probe --golden DIR"

Watch = Callable[[int, str], None]  # (candidate index or REFERENCE, what is about to happen to it)
Progress = Callable[[str], None]


class Status(str, Enum):
    """A candidate's outcome: passed and timed, refused by a check, unable to load or run, or not checkable."""

    OK = "ok"
    REJECTED = "rejected"
    FAILED = "failed"
    UNVERIFIED = "unverified"  # its outputs could not be checked (no golden inputs, structured input): never chosen


@dataclass(frozen=True)
class Figure:
    """One candidate's measurement; fields it never reached stay None (and out of ``to_dict``).

    ``signal`` names the signal that killed the child process measuring it (``SIGABRT``), when one did.
    """

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
    signal: str | None = None

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
        for key in ("load_ms", "max_rel_error", "runs", "median_ms", "p95_ms", "memory_mb", "signal"):
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
            signal=str(data["signal"]) if data.get("signal") else None,
        )


@dataclass(frozen=True)
class Measured:
    """Every candidate's figure (in the order given), and the winner's index with the decision (None: none passed)."""

    figures: tuple[Figure, ...]
    winner: int | None = None
    decision: Decision | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON form, for the child process's answer."""
        return {"figures": [f.to_dict() for f in self.figures], "winner": self.winner,
                "decision": self.decision.to_dict() if self.decision else None}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Measured:
        """Inverse of ``to_dict``."""
        decision = data.get("decision")
        winner = data.get("winner")
        return cls(tuple(Figure.from_dict(f) for f in data["figures"]), int(winner) if winner is not None else None,
                   Decision.from_dict(decision) if decision else None)


def input_structure(specs: Sequence[TensorSpec]) -> str | None:
    """Why synthetic noise cannot stand for this model's inputs, or None when it can.

    Uniform noise is a fair sample of one kind of input only: a flat vector of float features, that
    is one float input of rank 2 or less. Anything else has structure that noise lacks, and outputs
    on noise say nothing about accuracy on real data:

    - a non-float input (token ids, indices, masks, sizes, a sample rate, text): its values mean something;
    - several inputs: their values belong together (a recurrent state, a mask, a rate beside a signal);
    - a float input of rank 3 or more: an image, a sequence or a signal, whose content is its
      structure (a detector finds nothing in noise, and its near-empty outputs magnify harmless
      differences between backends into rejections).
    """
    if len(specs) > 1:
        return f"{len(specs)} inputs ({', '.join(s.name for s in specs)}) whose values belong together"
    for spec in specs:
        if not spec.dtype.startswith("float"):
            return f"input '{spec.name}' is {spec.dtype}: its values mean something that noise does not"
        if len(spec.shape) >= 3:
            return f"input '{spec.name}' of rank {len(spec.shape)} is an image, a sequence or a signal"
    return None


@dataclass(frozen=True)
class _Reference:
    """The inputs every candidate runs, the outputs it must reproduce, and why they cannot be checked (None: they can)."""

    feeds: dict[str, np.ndarray]
    want: dict[str, Any]
    unchecked: str | None = None


def measure_candidates(
    model_path: Path,
    candidates: Sequence[Candidate],
    golden: Mapping[str, np.ndarray] | None,
    expected: Mapping[str, np.ndarray] | None,
    precision: str,
    budget: Budget,
    *,
    progress: Progress | None = None,
    registry: BackendRegistry | None = None,
    watch: Watch | None = None,
) -> Measured:
    """Figures for every candidate (load, verify placement and outputs, time) and the decision among those that passed.

    Raises ModelError when the reference device cannot run the inputs. ``registry`` is the backend
    registry to open candidates from (the process-wide one by default; a tie's memory is measured in
    a child only with that one, which the child can rebuild).
    """
    note = watch or (lambda index, doing: None)
    reference = _reference(model_path, golden, expected, registry, note)
    figures: list[Figure] = []
    active: list[tuple[Runner, int]] = []
    try:
        for index, cand in enumerate(candidates):
            if progress:
                progress(f"checking {cand.name}")
            fig, runner = _qualify(cand, model_path, reference, precision, registry, functools.partial(note, index))
            figures.append(fig)
            if runner is not None:
                active.append((runner, index))
        if not active:
            return Measured(tuple(figures))
        if progress:
            progress(f"timing {len(active)} backend(s) in interleaved blocks for at most {budget.seconds:g} s")
        result = _time(model_path, active, figures, reference.feeds, budget, progress, registry, note)
        for slot, ((_, index), timing) in enumerate(zip(active, result.timings, strict=True)):
            ms = np.array(timing.samples) * 1000.0
            figures[index] = replace(figures[index], runs=len(ms), median_ms=round(float(np.median(ms)), 4),
                                     p95_ms=round(float(np.percentile(ms, 95)), 4), memory_mb=result.memory_mb.get(slot))
    finally:
        for runner, index in active:
            note(index, "closing")
            runner.close()
    winner = active[result.winner][1]
    figures = [replace(f, chosen=i == winner) for i, f in enumerate(figures)]
    return Measured(tuple(figures), winner, result.decision)


def _reference(model_path: Path, golden: Mapping[str, np.ndarray] | None, expected: Mapping[str, np.ndarray] | None,
               registry: BackendRegistry | None, note: Watch) -> _Reference:
    """Golden feeds (synthetic when absent) and the outputs every candidate must reproduce."""
    if golden is not None and expected is not None:
        return _Reference(dict(golden), dict(expected))
    note(REFERENCE, "loading")
    with reference_candidate(registry).open(model_path) as ref:
        unchecked = input_structure(ref.inputs) if golden is None else None
        feeds = dict(golden) if golden is not None else synthetic_feeds(ref.inputs)
        note(REFERENCE, "running")
        try:
            want = ref.infer(feeds)
        except EdgeError as exc:
            raise ModelError(f"{model_path.name}: the reference backend cannot run the golden inputs: {exc}") from exc
        except Exception as exc:  # onnxruntime's own errors, e.g. a generated value out of range
            raise ModelError(
                f"{model_path.name}: the reference backend failed on {'golden' if golden else 'generated'} inputs "
                f"(pass golden inputs: {GOLDEN_HINT}): {one_line(exc)}"
            ) from exc
        note(REFERENCE, "closing")
    return _Reference(feeds, want, unchecked)


def _qualify(cand: Candidate, model_path: Path, reference: _Reference, precision: str,
             registry: BackendRegistry | None, note: Callable[[str], None]) -> tuple[Figure, Runner | None]:
    """Load one candidate and check placement and outputs; the runner stays active if it passed."""
    fig = Figure(cand.name, dict(cand.options), Status.FAILED)
    declared = cand.declaration(registry)
    if declared is not None and precision not in declared.precisions:
        why = f"{cand.name} does not run {precision} models (only {', '.join(declared.precisions)})"
        return replace(fig, status=Status.REJECTED, reason=why), None
    note("loading")
    runner = cand.open(model_path, registry)
    try:
        start = time.perf_counter()
        runner.activate()
        placement = runner.placement
        fig = replace(fig, load_ms=round((time.perf_counter() - start) * 1000, 2), placement=placement)
        if not placement.accelerated:
            note("closing")
            runner.close()
            return replace(fig, status=Status.REJECTED, reason=_fallback_reason(placement)), None
        if reference.unchecked is not None and cand != reference_candidate(registry):
            note("closing")
            runner.close()
            why = f"outputs not checked: {reference.unchecked}, and no golden inputs were given ({GOLDEN_HINT})"
            return replace(fig, status=Status.UNVERIFIED, reason=why), None
        note("checking outputs")
        check = compare_outputs(runner.infer(reference.feeds), reference.want, precision)
        fig = replace(fig, max_rel_error=check.max_rel_error)
        if check.problem:
            note("closing")
            runner.close()
            return replace(fig, status=Status.REJECTED, reason=check.problem), None
        return replace(fig, status=Status.OK), runner
    except Exception as exc:  # a backend that cannot load or run this model is just not a candidate
        note("closing")
        runner.close()
        return replace(fig, reason=one_line(exc)), None


def _time(model_path: Path, active: list[tuple[Runner, int]], figures: list[Figure], feeds: dict[str, np.ndarray],
          budget: Budget, progress: Progress | None, registry: BackendRegistry | None, note: Watch) -> Contest:
    """The contest between the active runners, timed on the real runtimes; memory measured in a child if a tie asks."""

    def run_block(slot: int, runs: int) -> list[float]:
        runner, index = active[slot]
        note(index, "timing")
        settle()
        if runs > 1:  # uncounted: the first run after a pause pays for waking the runtime's threads
            runner.infer(feeds, check=False)
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            runner.infer(feeds, check=False)
            times.append(time.perf_counter() - start)
        return times

    def memory(slot: int) -> float | None:
        if registry is not None:  # the child process only knows the process-wide registry
            return None
        if progress:
            progress(f"tie: measuring the memory of {figures[active[slot][1]].backend}")
        return footprint_mb(figures[active[slot][1]].candidate, model_path, feeds)

    names = [_label(figures[index]) for _, index in active]
    return contest(names, run_block, budget=budget, memory=memory, progress=progress)


def settle() -> None:
    """Wait, at most ``SETTLE_MAX_S``, until the runtime timed last stops spinning its threads in this process."""
    deadline = time.perf_counter() + SETTLE_MAX_S
    calm = 0
    while calm < SETTLE_CALM_STEPS and time.perf_counter() < deadline:
        used = time.process_time()
        time.sleep(SETTLE_STEP_S)
        calm = calm + 1 if time.process_time() - used < SETTLE_BUSY * SETTLE_STEP_S else 0


def _label(fig: Figure) -> str:
    """The backend's name, with its options when it has any (CoreML's two model formats share one name)."""
    options = ",".join(f"{k}={v}" for k, v in sorted(fig.options.items()))
    return f"{fig.backend}[{options}]" if options else fig.backend


def _fallback_reason(placement: Placement) -> str:
    taken = (placement.nodes or {}).get(placement.requested, 0)
    total = placement.total_nodes if placement.total_nodes is not None else "?"
    return f"{placement.requested} took {taken}/{total} nodes: it would run on {placement.effective}"
