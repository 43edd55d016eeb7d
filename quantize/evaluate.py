"""Accuracy of a variant against labels or the float model's outputs: one metric per output (quantize.metrics)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from agent.errors import ModelError, UserError
from quantize.metrics import OutputMetric, cosine, score_output
from quantize.samples import SampleSet, cast_to_inputs

__all__ = ["Accuracy", "OutputScore", "Outputs", "load_labels", "measure", "run_outputs"]

Outputs = list[list[np.ndarray]]  # per sample, per model output


@dataclass(frozen=True)
class OutputScore:
    """One output's metric in points (0..100, higher is better) and two signal-level figures."""

    output: str
    metric: str
    reference: float  # the float model's value on the same data
    value: float
    sqnr_db: float
    cosine: float

    @property
    def drop(self) -> float:
        """Points lost against the float model."""
        return round(self.reference - self.value, 6)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready figures, drop included."""
        return {"output": self.output, "metric": self.metric, "reference": self.reference, "value": self.value,
                "drop": self.drop, "sqnr_db": self.sqnr_db, "cosine": self.cosine}


@dataclass(frozen=True)
class Accuracy:
    """Every output's score; the budget applies to each, so the headline figures are the worst output's."""

    outputs: tuple[OutputScore, ...]

    @property
    def worst(self) -> OutputScore:
        """The output that lost the most points (the first one on a tie)."""
        return max(self.outputs, key=lambda s: s.drop)

    @property
    def metric(self) -> str:
        """The worst output's metric, with the output named when there are several."""
        worst = self.worst
        return worst.metric if len(self.outputs) == 1 else f"{worst.metric} ({worst.output})"

    @property
    def reference(self) -> float:
        return self.worst.reference

    @property
    def value(self) -> float:
        return self.worst.value

    @property
    def drop(self) -> float:
        return self.worst.drop

    @property
    def sqnr_db(self) -> float:
        return min(s.sqnr_db for s in self.outputs)

    @property
    def cosine(self) -> float:
        return min(s.cosine for s in self.outputs)

    def to_dict(self) -> dict[str, object]:
        """The worst output's figures at the top level, then one entry per output."""
        return {"metric": self.metric, "reference": self.reference, "value": self.value, "drop": self.drop,
                "sqnr_db": self.sqnr_db, "cosine": self.cosine, "outputs": [s.to_dict() for s in self.outputs]}


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


def measure(metrics: list[OutputMetric], reference: Outputs, outputs: Outputs, labels: np.ndarray | None) -> Accuracy:
    """Compare `outputs` with the float model's `reference`, output by output (and with labels when given)."""
    scores = []
    labelled = _labelled_output(metrics) if labels is not None else None
    for index, metric in enumerate(metrics):
        ref = [sample[index] for sample in reference]
        got = [sample[index] for sample in outputs]
        sqnr, cos = _signal(ref, got)
        if index == labelled:
            assert labels is not None
            scores.append(OutputScore(metric.output, "top-1 accuracy", _top1(ref, labels), _top1(got, labels), sqnr, cos))
            continue
        scores.append(OutputScore(metric.output, metric.title, 100.0, score_output(metric, ref, got), sqnr, cos))
    return Accuracy(tuple(scores))


def _labelled_output(metrics: list[OutputMetric]) -> int:
    """Labels score the first classifier output (the first output when none looks like one)."""
    return next((i for i, m in enumerate(metrics) if m.metric == "top1"), 0)


def _top1(outputs: list[np.ndarray], labels: np.ndarray) -> float:
    predicted = np.concatenate([np.argmax(o.reshape(o.shape[0], -1), -1) for o in outputs])
    return round(100.0 * float(np.mean(predicted == labels[: len(predicted)])), 4)


def _signal(reference: list[np.ndarray], outputs: list[np.ndarray]) -> tuple[float, float]:
    """SQNR (dB, capped at 100) and mean cosine of one output over every sample."""
    if not reference or not np.issubdtype(reference[0].dtype, np.floating):
        return 100.0, 1.0
    cosines, signal, noise = [], 0.0, 0.0
    for ref, got in zip(reference, outputs, strict=True):
        r, g = ref.astype(np.float64).ravel(), got.astype(np.float64).ravel()
        signal += float(r @ r)
        noise += float((r - g) @ (r - g))
        cosines.append(cosine(r, g))
    sqnr = 100.0 if noise == 0 else min(100.0, 10 * np.log10(max(signal, 1e-30) / noise))
    return round(float(sqnr), 3), round(float(np.mean(cosines)), 8)
