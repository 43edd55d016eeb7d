"""Accuracy of a variant against the user's model on the same samples: one metric per output (quantize.metrics)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from edgecore.errors import ModelError, UserError
from quantize.budget import Accuracy, Budget, OutputScore
from quantize.metrics import OutputMetric
from quantize.samples import SampleSet, cast_to_inputs
from quantize.scoring import labelled_score, score_output

__all__ = ["Outputs", "load_labels", "measure", "quiet_options", "run_outputs"]

Outputs = list[list[np.ndarray]]  # per sample, per model output

def load_labels(folder: Path, count: int) -> np.ndarray | None:
    """Integer labels from labels.txt or labels.npy in `folder`, one per sample in name order."""
    txt, npy = folder / "labels.txt", folder / "labels.npy"
    if npy.is_file():
        labels: np.ndarray = np.load(npy, allow_pickle=False).astype(np.int64).ravel()
    elif txt.is_file():
        try:
            labels = np.array([int(line) for line in txt.read_text().split()], np.int64)
        except ValueError as exc:
            raise UserError(f"{txt}: one integer label per line ({exc})") from exc
    else:
        return None
    if len(labels) != count:
        raise UserError(f"{folder}: {len(labels)} labels for {count} samples")
    return labels


def run_outputs(model: onnx.ModelProto, samples: SampleSet, session: ort.InferenceSession | None = None) -> Outputs:
    """Every output for every sample, on onnxruntime's CPU provider."""
    try:
        if session is None:
            session = ort.InferenceSession(model.SerializeToString(), quiet_options(),
                                           providers=["CPUExecutionProvider"])
        return [[np.asarray(o) for o in session.run(None, cast_to_inputs(model, feeds))] for feeds in samples]
    except (ort.capi.onnxruntime_pybind11_state.Fail, RuntimeError) as exc:
        raise ModelError(f"onnxruntime cannot run the model: {str(exc).splitlines()[0]}") from exc


def quiet_options() -> ort.SessionOptions:
    """Session options that log warnings (they go to the runtime log, see quantize.runtime_log)."""
    options = ort.SessionOptions()
    options.log_severity_level = 2
    return options


def measure(metrics: list[OutputMetric], reference: Outputs, outputs: Outputs, labels: np.ndarray | None,
            budget: Budget) -> Accuracy:
    """Compare `outputs` with the user's model's `reference`, output by output (and with labels when given)."""
    labelled = _labelled_output(metrics) if labels is not None else None
    index = {m.output: i for i, m in enumerate(metrics)}
    scores: list[OutputScore] = []
    for i, metric in enumerate(metrics):
        ref = [sample[i] for sample in reference]
        got = [sample[i] for sample in outputs]
        if i == labelled:
            assert labels is not None
            scores.append(labelled_score(metric.output, ref, got, labels))
            continue
        partner = None
        if metric.partner:
            j = index[metric.partner]
            partner = ([sample[j] for sample in reference], [sample[j] for sample in outputs])
        scores.append(score_output(metric, ref, got, partner))
    return Accuracy(tuple(scores), budget)


def _labelled_output(metrics: list[OutputMetric]) -> int:
    """Labels score the first class-score output (the first output when none looks like one)."""
    return next((i for i, m in enumerate(metrics) if m.metric in ("top1", "top5")), 0)
