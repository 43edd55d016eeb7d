"""Accuracy of a variant against labels or the float model's outputs, with a metric chosen by output type."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from agent.errors import ModelError, UserError
from quantize.samples import SampleSet, cast_to_inputs

__all__ = ["Accuracy", "Outputs", "load_labels", "measure", "run_outputs"]

Outputs = list[list[np.ndarray]]  # per sample, per model output


@dataclass(frozen=True)
class Accuracy:
    """The primary metric in points (0..100, higher is better) and two signal-level figures."""

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
        return {**asdict(self), "drop": self.drop}


def load_labels(folder: Path, count: int) -> np.ndarray | None:
    """Integer labels from labels.txt or labels.npy in `folder`, one per sample in name order."""
    txt, npy = folder / "labels.txt", folder / "labels.npy"
    if npy.is_file():
        labels = np.load(npy, allow_pickle=False).astype(np.int64).ravel()
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


def run_outputs(model: onnx.ModelProto, samples: SampleSet) -> Outputs:
    """Every output for every sample, on onnxruntime's CPU provider."""
    try:
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return [[np.asarray(o) for o in session.run(None, cast_to_inputs(model, feeds))] for feeds in samples]
    except (ort.capi.onnxruntime_pybind11_state.Fail, RuntimeError) as exc:
        raise ModelError(f"onnxruntime cannot run the model: {str(exc).splitlines()[0]}") from exc


def measure(reference: Outputs, outputs: Outputs, labels: np.ndarray | None) -> Accuracy:
    """Compare `outputs` with the float model's `reference` (and labels when given)."""
    sqnr, cosine = _signal(reference, outputs)
    if labels is not None:
        ref, got = _top1(reference, labels), _top1(outputs, labels)
        return Accuracy("top-1 accuracy", ref, got, sqnr, cosine)
    boxes = _detector_outputs(reference[0])
    if boxes is not None:
        return Accuracy("box agreement", 100.0, _box_agreement(reference, outputs, *boxes), sqnr, cosine)
    if _is_classifier(reference[0][0]):
        agree = np.mean([np.argmax(r[0], -1).ravel().tolist() == np.argmax(o[0], -1).ravel().tolist()
                         for r, o in zip(reference, outputs, strict=False)])
        return Accuracy("top-1 agreement", 100.0, round(100.0 * float(agree), 4), sqnr, cosine)
    return Accuracy("cosine similarity", 100.0, round(100.0 * cosine, 6), sqnr, cosine)


def _top1(outputs: Outputs, labels: np.ndarray) -> float:
    predicted = np.concatenate([np.argmax(o[0].reshape(o[0].shape[0], -1), -1) for o in outputs])
    return round(100.0 * float(np.mean(predicted == labels[: len(predicted)])), 4)


def _is_classifier(output: np.ndarray) -> bool:
    return output.ndim == 2 and output.shape[-1] > 1


def _signal(reference: Outputs, outputs: Outputs) -> tuple[float, float]:
    cosines, signal, noise = [], 0.0, 0.0
    for ref_list, got_list in zip(reference, outputs, strict=False):
        for ref, got in zip(ref_list, got_list, strict=False):
            if not np.issubdtype(ref.dtype, np.floating):
                continue
            r, g = ref.astype(np.float64).ravel(), got.astype(np.float64).ravel()
            signal += float(r @ r)
            noise += float((r - g) @ (r - g))
            denom = np.linalg.norm(r) * np.linalg.norm(g)
            if denom == 0:  # identical only when both are zero
                cosines.append(1.0 if not r.any() and not g.any() else 0.0)
            else:
                cosines.append(float(r @ g / denom))
    sqnr = 100.0 if noise == 0 else min(100.0, 10 * np.log10(max(signal, 1e-30) / noise))
    return round(float(sqnr), 3), round(float(np.mean(cosines)) if cosines else 1.0, 8)


def _detector_outputs(first: list[np.ndarray]) -> tuple[int, int] | None:
    """Indices of (scores, boxes) outputs: boxes end in 4, scores share the anchor count."""
    for b, boxes in enumerate(first):
        if boxes.ndim >= 2 and boxes.shape[-1] == 4:
            for s, scores in enumerate(first):
                if s != b and scores.ndim == boxes.ndim and scores.shape[:-1] == boxes.shape[:-1]:
                    return s, b
    return None


def _box_agreement(reference: Outputs, outputs: Outputs, s: int, b: int) -> float:
    """Share of the float model's confident detections the variant reproduces (IoU >= 0.5, same decision)."""
    hits, total = 0, 0
    for ref, got in zip(reference, outputs, strict=False):
        ref_conf, got_conf = _confidence(ref[s]), _confidence(got[s])
        chosen = np.flatnonzero(ref_conf > 0.5)
        if chosen.size == 0:
            chosen = np.argsort(ref_conf)[-5:]
        iou = _iou(ref[b].reshape(-1, 4)[chosen], got[b].reshape(-1, 4)[chosen])
        same = (ref_conf[chosen] > 0.5) == (got_conf[chosen] > 0.5)
        hits += int(np.sum((iou >= 0.5) & same))
        total += chosen.size
    return round(100.0 * hits / max(total, 1), 4)


def _confidence(scores: np.ndarray) -> np.ndarray:
    flat = scores.reshape(-1, scores.shape[-1])
    return flat[:, 1:].max(-1) if flat.shape[-1] > 1 else flat[:, 0]  # column 0 is background


def _iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    lo, hi = np.maximum(a[:, :2], b[:, :2]), np.minimum(a[:, 2:], b[:, 2:])
    inter = np.prod(np.clip(hi - lo, 0, None), -1)
    area = lambda x: np.prod(np.clip(x[:, 2:] - x[:, :2], 0, None), -1)  # noqa: E731
    return inter / np.maximum(area(a) + area(b) - inter, 1e-12)
