"""The user's model as the reference: its outputs on the evaluation samples, and every rewrite checked against it.

Quantization starts from a rewritten model (opset raised for per-channel QDQ, onnxruntime's
pre-processing: shape inference, fusions). ``prepare_for_int8`` checks the rewrite against the
user's model on the evaluation samples; an opset conversion that changes the outputs (onnx's
converter turns an opset-9 ``Upsample`` into a ``Resize`` with other coordinates) is retried at
the lowest opset QDQ allows, and a rewrite that still changes them beyond float noise is reported
with its figure: every variant built from it is measured against the user's model, so its figures
carry that change.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx

from edgecore.errors import ModelError
from quantize.budget import Accuracy, Budget
from quantize.evaluate import Outputs, load_labels, measure, run_outputs
from quantize.metrics import OutputMetric, choose_metrics
from quantize.opset import PER_CHANNEL_OPSET, QDQ_OPSET, Converter, default_opset, upgrade_opset
from quantize.passes import prepare
from quantize.recipe import Recipe
from quantize.samples import InputSpec, SampleSet
from quantize.scoring import sqnr_db

__all__ = ["NOISE_DB", "EvalSet", "Rewrite", "eval_samples", "prepare_for_int8", "reference_set"]

NOISE_DB = 60.0  # float32 rewrites (fusions, constant folding) stay far above this; a real change falls below
_EVAL_FROM_CALIB = 64  # samples taken from the calibration set when no --eval is given


@dataclass(frozen=True)
class EvalSet:
    """Samples, optional labels, the user's model's outputs on them, and the metric of each output."""

    samples: SampleSet
    labels: np.ndarray | None
    reference: Outputs
    source: str
    metrics: list[OutputMetric]
    budget: Budget

    def score(self, outputs: Outputs) -> Accuracy:
        """`outputs` (a variant's, on `samples`) against the user's model."""
        return measure(self.metrics, self.reference, outputs, self.labels, self.budget)


@dataclass(frozen=True)
class Rewrite:
    """The model quantization starts from, checked against the user's model."""

    steps: tuple[str, ...]
    accuracy: Accuracy
    sqnr_db: float  # the worst float output's SQNR against the user's model
    exact: bool  # integer outputs equal

    @property
    def faithful(self) -> bool:
        """True when the rewrite changes no output beyond float noise."""
        return self.exact and self.sqnr_db >= NOISE_DB

    def note(self) -> str:
        """What was rewritten and how it compares with the user's model."""
        steps = ", ".join(self.steps)
        if self.faithful:
            return f"rewrites before quantization ({steps}) checked against your model: outputs unchanged " \
                   f"(SQNR >= {min(self.sqnr_db, 100.0):.0f} dB, float noise)"
        return (f"WARNING: the rewrites before quantization ({steps}) CHANGE your model's outputs: "
                f"{self.accuracy.summary()} (SQNR {self.sqnr_db:.1f} dB); every quantized figure below is measured "
                "against your model and includes this change")

    def to_dict(self) -> dict[str, object]:
        """JSON-ready."""
        return {"steps": list(self.steps), "faithful": self.faithful, "sqnr_db": round(self.sqnr_db, 3),
                "accuracy": self.accuracy.to_dict()}


def reference_set(original: onnx.ModelProto, samples: SampleSet, labels: np.ndarray | None, source: str,
                  asked: dict[str, str], budget: Budget, notes: list[str]) -> EvalSet:
    """The user's model run on `samples`: the outputs every variant is compared with, and the metrics."""
    reference = run_outputs(original, samples)
    metrics = choose_metrics(original, reference, asked)
    notes.append("metric per output: " + "; ".join(f"{m.output}: {m.title} ({m.why})" for m in metrics))
    return EvalSet(samples, labels, reference, source, metrics, budget)


def eval_samples(eval_dir: Path | None, calib_dir: Path | None, calib: SampleSet | None, specs: list[InputSpec],
                 preprocess: Path | None, max_eval: int, notes: list[str]) -> tuple[SampleSet, np.ndarray | None, str]:
    """The samples to score on: --eval, else calibration samples, else 16 random ones (each says so)."""
    if eval_dir is not None:
        samples = SampleSet.from_dir(eval_dir, specs, preprocess, limit=max_eval)
        labels = load_labels(eval_dir, len(SampleSet.from_dir(eval_dir, specs, preprocess)))
        labels = None if labels is None else labels[: len(samples)]
        return samples, labels, f"{eval_dir} ({len(samples)} samples{', labels' if labels is not None else ''})"
    if calib is not None or calib_dir is not None:
        # An fp16-only plan loads no calibration set, but the --calib samples are still the data to score on
        # (random ones can drive a Loop's count or an If's branch where real inputs never go).
        pool = calib if calib is not None else SampleSet.from_dir(_known(calib_dir), specs, preprocess)
        samples = pool.head(_EVAL_FROM_CALIB)
        notes.append("no --eval: accuracy measured against your model on calibration samples (optimistic)")
        return samples, None, f"calibration samples ({len(samples)})"
    notes.append("no --eval or --calib: accuracy measured against your model on 16 random samples")
    samples = SampleSet.synthetic_set(specs, 16)
    return samples, None, f"synthetic samples ({len(samples)})"


def prepare_for_int8(base: onnx.ModelProto, recipes: list[Recipe], evalset: EvalSet, notes: list[str],
                     convert: Converter | None) -> tuple[onnx.ModelProto, list[Recipe], Rewrite]:
    """The model INT8 is built from (opset raised, pre-processed), checked against the user's model.

    Per-channel QDQ needs opset 13; when raising the opset fails, or changes the outputs, the lowest
    opset QDQ allows is tried (per-tensor weights) and the more faithful of the two is kept.
    """
    current = default_opset(base)
    tried: list[tuple[onnx.ModelProto, bool, Rewrite]] = []
    failures: list[str] = []
    targets = [PER_CHANNEL_OPSET] + ([max(current, QDQ_OPSET)] if current < PER_CHANNEL_OPSET else [])
    for opset in targets:
        try:
            model, upgraded = upgrade_opset(base, opset, *([convert] if convert else []))
        except ModelError as exc:
            failures.append(str(exc))
            continue
        model, skipped = prepare(model)
        steps = ([upgraded] if upgraded else []) + ["onnxruntime quant_pre_process" if skipped is None else skipped]
        rewrite = check_rewrite(model, tuple(steps), evalset)
        tried.append((model, opset >= PER_CHANNEL_OPSET, rewrite))
        if rewrite.faithful:
            break
    if not tried:
        raise ModelError(f"{failures[-1]}; QuantizeLinear needs opset {QDQ_OPSET}")
    model, per_channel, rewrite = max(tried, key=lambda t: (t[2].faithful, t[2].sqnr_db))
    notes.extend(failures)
    if not per_channel:
        why = "" if failures else (f" (opset {current} -> {PER_CHANNEL_OPSET} changed your model's outputs: SQNR "
                                   f"{tried[0][2].sqnr_db:.1f} dB)")
        notes.append(f"kept opset {default_opset(model)}{why}: per-channel weights off, per-tensor QDQ")
        recipes = [replace(r, per_channel=False) if r.precision == "int8" else r for r in recipes]
    notes.append(rewrite.note())
    return model, recipes, rewrite


def check_rewrite(model: onnx.ModelProto, steps: tuple[str, ...], evalset: EvalSet) -> Rewrite:
    """`model` (a rewrite of the user's) run on the evaluation samples and compared with the user's model."""
    outputs = run_outputs(model, evalset.samples)
    accuracy = evalset.score(outputs)
    ref_floats = [i for i, r in enumerate(evalset.reference[0]) if np.issubdtype(r.dtype, np.floating)]
    worst = min((sqnr_db([s[i] for s in evalset.reference], [s[i] for s in outputs]) for i in ref_floats),
                default=100.0)
    exact = all(np.array_equal(r[i], o[i]) for r, o in zip(evalset.reference, outputs, strict=True)
                for i in range(len(r)) if i not in ref_floats)
    return Rewrite(steps, accuracy, worst, exact)


def _known(folder: Path | None) -> Path:
    assert folder is not None
    return folder
