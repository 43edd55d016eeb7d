"""Choose the backend by measuring it: check outputs against a reference, time, pick the fastest.

For each candidate: load it, refuse it if its accelerator took no or few nodes (that is CPU in
disguise), compare its outputs on the golden inputs with the expected outputs (or, without them,
with onnxruntime's CPU provider) within a tolerance set by the model's precision, warm it up, then
time it. Candidates are timed in alternating blocks within one time budget, so that a noisy
neighbour slows all of them alike. The decision is cached in a JSON file keyed by the model's sha256, the hardware
fingerprint, the runtime versions and the candidate list; any change re-measures.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agent.backends import Candidate, Runner, TensorSpec, candidate_backends, runtime_versions
from agent.errors import EdgeError, ModelError, OperationFailed, VerificationError
from agent.hardware import Hardware

__all__ = ["REFERENCE", "TOLERANCE", "Selection", "model_precision", "select_backend"]

log = logging.getLogger(__name__)

REFERENCE = Candidate("onnxruntime", "CPUExecutionProvider")
# Largest allowed max|got - want| / max|want| per model precision; integer outputs (labels) may
# differ on at most this share of elements, and never for fp32 models.
TOLERANCE = {"fp32": 1e-3, "fp16": 2e-2, "int8": 6e-2}
_INT_MISMATCH = {"fp32": 0.0, "fp16": 0.01, "int8": 0.02}
_SCHEMA = 1
WARMUP_RUNS = 3
MIN_RUNS = 5
MAX_RUNS = 500
BLOCK_ROUNDS = 4


@dataclass
class Selection:
    """The chosen backend for one model on one device, with every candidate's figures.

    ``open()`` returns a NEW, not yet activated runner of the chosen backend: use it in a
    ``with`` block or hand it to ``ModelRegistry.publish``, which activates it.
    """

    model_path: Path
    model_sha256: str
    candidate: Candidate
    figures: list[dict[str, Any]]
    key: str
    precision: str
    cached: bool = False
    measured_at: float = field(default_factory=time.time)

    @property
    def backend(self) -> str:
        """The chosen runner's name, e.g. ``openvino/CPU``."""
        return self.candidate.name

    def open(self) -> Runner:
        """A new, inactive runner of the chosen backend."""
        return self.candidate.open(self.model_path)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form for the cache, telemetry and ``edge-agent probe``."""
        return {
            "schema": _SCHEMA,
            "key": self.key,
            "model": str(self.model_path),
            "model_sha256": self.model_sha256,
            "backend": self.backend,
            "candidate": self.candidate.to_dict(),
            "precision": self.precision,
            "measured_at": self.measured_at,
            "cached": self.cached,
            "figures": self.figures,
        }


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
) -> Selection:
    """Measure the candidates for ``model_path`` on this hardware and return the fastest that passes.

    ``candidates`` overrides the list derived from hardware and installed runtimes;
    ``precision`` (fp32, fp16, int8) overrides the one read from the model.
    """
    model_path = Path(model_path)
    sha = _sha256(model_path)
    if candidates is None:
        candidates = candidate_backends(hardware, allowed_providers)
    if not candidates:
        raise VerificationError(
            f"{model_path.name}: no backend on this device matches the allowed providers {list(allowed_providers or [])}"
        )
    key = _cache_key(sha, hardware, candidates)
    cache_file = Path(cache_dir) / f"selection-{sha[:16]}.json"
    if not remeasure:
        cached = _load_cached(cache_file, key, model_path)
        if cached is not None:
            return cached
    precision = precision or model_precision(model_path)
    figures = _measure(model_path, list(candidates), golden, expected, precision, time_budget_s, progress)
    passing = [f for f in figures if f["status"] == "ok"]
    if not passing:
        reasons = "; ".join(f"{f['backend']}: {f['reason']}" for f in figures)
        raise OperationFailed(f"{model_path.name}: no backend passed: {reasons}")
    best = min(passing, key=lambda f: f["median_ms"])
    for fig in figures:
        fig["chosen"] = fig is best
    chosen = next(c for c in candidates if c.name == best["backend"] and c.options == best["options"])
    selection = Selection(model_path, sha, chosen, figures, key, precision)
    _save(cache_file, selection)
    log.info("%s: chose %s (%.3f ms median)", model_path.name, chosen.name, best["median_ms"])
    return selection


def model_precision(model_path: Path) -> str:
    """``int8`` for quantized graphs, ``fp16`` for half-precision weights, else ``fp32``."""
    try:
        import onnx
    except ImportError:  # a device image without onnx: assume the strictest tolerance
        return "fp32"
    try:
        model = onnx.load(str(model_path), load_external_data=False)
    except Exception as exc:  # protobuf DecodeError and friends
        raise ModelError(f"{model_path.name}: not a readable ONNX model: {exc}") from exc
    quantized = {"QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul", "MatMulInteger", "ConvInteger"}
    if any(node.op_type in quantized for node in model.graph.node):
        return "int8"
    if any(init.data_type == onnx.TensorProto.FLOAT16 for init in model.graph.initializer):
        return "fp16"
    return "fp32"


def _measure(
    model_path: Path,
    candidates: list[Candidate],
    golden: Mapping[str, np.ndarray] | None,
    expected: Mapping[str, np.ndarray] | None,
    precision: str,
    budget_s: float,
    progress: Callable[[str], None] | None,
) -> list[dict[str, Any]]:
    """Figures for every candidate: load, verify placement and outputs, then time them."""
    feeds, want = _reference(model_path, golden, expected)
    figures: list[dict[str, Any]] = []
    active: list[tuple[Runner, dict[str, Any]]] = []
    try:
        for cand in candidates:
            if progress:
                progress(f"checking {cand.name}")
            fig, runner = _qualify(cand, model_path, feeds, want, precision)
            figures.append(fig)
            if runner is not None:
                active.append((runner, fig))
        _time_in_blocks(active, feeds, budget_s, progress)
    finally:
        for runner, _ in active:
            runner.close()
    return figures


def _reference(
    model_path: Path, golden: Mapping[str, np.ndarray] | None, expected: Mapping[str, np.ndarray] | None
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Golden feeds (generated when absent) and the outputs every candidate must reproduce."""
    if golden is not None and expected is not None:
        return dict(golden), dict(expected)
    with REFERENCE.open(model_path) as ref:
        feeds = dict(golden) if golden is not None else _generated_feeds(ref.inputs)
        try:
            return feeds, ref.infer(feeds)
        except EdgeError as exc:
            raise ModelError(f"{model_path.name}: the reference backend cannot run the golden inputs: {exc}") from exc
        except Exception as exc:  # onnxruntime's own errors, e.g. a generated value out of range
            raise ModelError(
                f"{model_path.name}: the reference backend failed on {'golden' if golden else 'generated'} inputs "
                f"(pass golden inputs): {exc}"
            ) from exc


def _generated_feeds(specs: list[TensorSpec]) -> dict[str, np.ndarray]:
    """Deterministic inputs: unknown dims are 1, floats in [0, 1), integers in [0, 10)."""
    rng = np.random.default_rng(0)
    feeds = {}
    for spec in specs:
        shape = [d if isinstance(d, int) and d >= 0 else 1 for d in spec.shape]
        dtype = np.dtype(spec.dtype)
        if dtype.kind == "f":
            feeds[spec.name] = rng.random(shape).astype(dtype)
        elif dtype.kind in "iu":
            feeds[spec.name] = rng.integers(0, 10, size=shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[spec.name] = rng.integers(0, 2, size=shape).astype(bool)
        else:
            feeds[spec.name] = np.full(shape, "a", dtype=object)
    return feeds


def _qualify(
    cand: Candidate, model_path: Path, feeds: dict[str, np.ndarray], want: dict[str, Any], precision: str
) -> tuple[dict[str, Any], Runner | None]:
    """Load one candidate and check placement and outputs; the runner stays active if it passed."""
    fig: dict[str, Any] = {"backend": cand.name, "options": dict(cand.options), "status": "failed"}
    runner = cand.open(model_path)
    try:
        start = time.perf_counter()
        runner.activate()
        fig["load_ms"] = round((time.perf_counter() - start) * 1000, 2)
        fig["placement"] = runner.placement
        if fig["placement"]["verdict"] in ("none", "fallback"):
            fig.update(status="rejected", reason=_fallback_reason(fig["placement"]))
            runner.close()
            return fig, None
        got = runner.infer(feeds)
        error = _compare(got, want, precision)
        fig["max_rel_error"] = error[0]
        if error[1]:
            fig.update(status="rejected", reason=error[1])
            runner.close()
            return fig, None
        fig["status"] = "ok"
        return fig, runner
    except Exception as exc:  # a backend that cannot load or run this model is just not a candidate
        fig["reason"] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        runner.close()
        return fig, None


def _fallback_reason(placement: dict[str, Any]) -> str:
    taken = placement.get("nodes", {}).get(placement["requested"], 0)
    total = placement.get("total_nodes", "?")
    return f"{placement['requested']} took {taken}/{total} nodes: it would run on {placement['effective']}"


def _compare(got: Mapping[str, Any], want: Mapping[str, Any], precision: str) -> tuple[float, str | None]:
    """Worst relative error over outputs, and why it fails (None when within tolerance)."""
    worst = 0.0
    for name, ref in want.items():
        if name not in got:
            return worst, f"output '{name}' is missing"
        value = got[name]
        if not isinstance(ref, np.ndarray) or not isinstance(value, np.ndarray):
            continue  # non-tensor outputs (ONNX-ML maps) only run on onnxruntime: nothing to compare
        if value.shape != ref.shape:
            return worst, f"output '{name}' has shape {list(value.shape)}, expected {list(ref.shape)}"
        if ref.dtype.kind in "iub":
            share = float(np.mean(value != ref)) if ref.size else 0.0
            if share > _INT_MISMATCH[precision]:
                return worst, f"output '{name}' differs on {share:.1%} of elements"
            continue
        if ref.dtype.kind != "f":
            continue
        scale = float(np.max(np.abs(ref))) if ref.size else 0.0
        diff = np.abs(value.astype(np.float64) - ref.astype(np.float64))
        rel = float(np.nanmax(diff)) / max(scale, 1e-6) if ref.size else 0.0
        worst = max(worst, rel)
        if rel > TOLERANCE[precision] or np.isnan(value).sum() != np.isnan(ref).sum():
            return worst, f"output '{name}' is off by {rel:.2e} of its range (tolerance {TOLERANCE[precision]:g} for {precision})"
    return worst, None


def _time_in_blocks(
    active: list[tuple[Runner, dict[str, Any]]],
    feeds: dict[str, np.ndarray],
    budget_s: float,
    progress: Callable[[str], None] | None,
) -> None:
    """Warm up, then time each candidate in alternating blocks until the budget is spent.

    Blocks, not single alternating runs: onnxruntime's thread pool keeps spinning for a while
    after a run and would slow whichever backend runs right after it. The first run of each
    block is not counted for the same reason.
    """
    if not active:
        return
    for runner, _ in active:
        for _ in range(WARMUP_RUNS):
            runner.infer(feeds, check=False)
    samples: list[list[float]] = [[] for _ in active]
    block_s = budget_s / (len(active) * BLOCK_ROUNDS)
    deadline = time.perf_counter() + budget_s
    if progress:
        progress(f"timing {len(active)} backend(s) for up to {budget_s:g} s")
    while True:
        for (runner, _), times in zip(active, samples, strict=False):
            runner.infer(feeds, check=False)
            block_end = time.perf_counter() + block_s
            while len(times) < MAX_RUNS:
                start = time.perf_counter()
                runner.infer(feeds, check=False)
                times.append(time.perf_counter() - start)
                if start >= block_end:
                    break
        fewest = min(len(t) for t in samples)
        if fewest >= MAX_RUNS or (fewest >= MIN_RUNS and time.perf_counter() >= deadline):
            break
    for (_, fig), times in zip(active, samples, strict=False):
        ms = np.array(times) * 1000.0
        fig.update(runs=len(times), median_ms=round(float(np.median(ms)), 4), p95_ms=round(float(np.percentile(ms, 95)), 4))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _cache_key(sha: str, hardware: Hardware, candidates: Sequence[Candidate]) -> str:
    blob = {
        "schema": _SCHEMA,
        "model_sha256": sha,
        "hardware": hardware.fingerprint(),
        "runtimes": runtime_versions(),
        "candidates": [c.to_dict() for c in candidates],
    }
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()


def _load_cached(cache_file: Path, key: str, model_path: Path) -> Selection | None:
    """The cached decision when its key still matches; a corrupt file just means re-measure."""
    try:
        data = json.loads(cache_file.read_text())
        if data.get("key") != key:
            return None
        return Selection(
            model_path=model_path,
            model_sha256=str(data["model_sha256"]),
            candidate=Candidate.from_dict(data["candidate"]),
            figures=list(data["figures"]),
            key=key,
            precision=str(data.get("precision", "fp32")),
            cached=True,
            measured_at=float(data["measured_at"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _save(cache_file: Path, selection: Selection) -> None:
    """Write the decision atomically (temp file, fsync, rename)."""
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache_file.with_suffix(f".tmp{os.getpid()}")
    with open(tmp, "w") as fh:
        json.dump({**selection.to_dict(), "cached": False}, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, cache_file)
