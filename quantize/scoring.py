"""Each metric's figure for one output over every sample, with its worst sample (see quantize.metrics)."""

from __future__ import annotations

import math

import numpy as np

from quantize.budget import OutputScore
from quantize.detection import IOU, SCORE_TOLERANCE, agreement
from quantize.metrics import OutputMetric

__all__ = ["CAP_DB", "labelled_score", "score_output", "sqnr_db"]

CAP_DB = 100.0  # a figure for an exact match; keeps JSON finite
Arrays = list[np.ndarray]  # one output, per sample


def score_output(metric: OutputMetric, ref: Arrays, got: Arrays, partner: tuple[Arrays, Arrays] | None = None) -> OutputScore:
    """`metric` of `got` against `ref` (the user's model's outputs on the same samples).

    `partner` is the other output of a detection pair (reference, candidate).
    """
    kind = metric.metric
    if kind in ("top1", "top5", "pixel-top1", "exact"):
        per_sample = [100.0 * float(np.mean(_agrees(kind, metric.axis, r, g))) for r, g in zip(ref, got, strict=True)]
        total = 100.0 * float(np.mean(np.concatenate([_agrees(kind, metric.axis, r, g).ravel()
                                                       for r, g in zip(ref, got, strict=True)])))
        worst = int(np.argmin(per_sample))
        return _score(metric, total, 100.0, worst, per_sample[worst])
    if kind == "detection":
        assert partner is not None, "a detection metric needs its partner output"
        return _detection(metric, ref, got, partner)
    if kind == "psnr":
        return _psnr(metric, ref, got)
    return _sqnr(metric, ref, got)


def labelled_score(output: str, ref: Arrays, got: Arrays, labels: np.ndarray) -> OutputScore:
    """Top-1 accuracy on `labels` of the candidate against the user's model's own accuracy."""
    metric = OutputMetric(output, "top1", "labels given with --eval")
    mine, theirs = _hits(got, labels), _hits(ref, labels)
    worst = int(np.argmin([h.mean() for h in mine])) if mine else 0
    return OutputScore(output, "top1", "top-1 accuracy", "points", _accuracy(mine), _accuracy(theirs), metric.why,
                       worst, round(100.0 * float(mine[worst].mean()), 4) if mine else 0.0)


def sqnr_db(ref: Arrays, got: Arrays) -> float:
    """SQNR of `got` against `ref` over every sample, in dB (capped at CAP_DB for an exact match)."""
    signal = sum(float(np.sum(np.square(r.astype(np.float64)))) for r in ref)
    noise = sum(float(np.sum(np.square(r.astype(np.float64) - g.astype(np.float64)))) for r, g in zip(ref, got, strict=True))
    if noise == 0:
        return CAP_DB
    return min(CAP_DB, 10 * math.log10(max(signal, 1e-30) / noise))


def _agrees(kind: str, axis: int, ref: np.ndarray, got: np.ndarray) -> np.ndarray:
    if kind == "exact":
        return np.asarray(ref == got)
    if kind == "top5":
        top5 = np.argsort(-got, axis=axis)
        top5 = np.take(top5, range(5), axis=axis)
        return np.asarray((top5 == np.expand_dims(np.argmax(ref, axis), axis)).any(axis=axis))
    return np.asarray(np.argmax(ref, axis) == np.argmax(got, axis))


def _sqnr(metric: OutputMetric, ref: Arrays, got: Arrays) -> OutputScore:
    """SQNR over every sample; the worst sample is the one with the largest relative error."""
    norms = [float(np.linalg.norm(r.astype(np.float64))) for r in ref]
    floor = 1e-3 * (float(np.mean(norms)) or 1.0)  # a near-zero reference must not make any error "infinite"
    errors = [float(np.linalg.norm(r.astype(np.float64) - g.astype(np.float64))) / max(n, floor)
              for r, g, n in zip(ref, got, norms, strict=True)]
    worst = int(np.argmax(errors))
    worst_db = CAP_DB if errors[worst] == 0 else min(CAP_DB, -20 * math.log10(errors[worst]))
    return _score(metric, sqnr_db(ref, got), CAP_DB, worst, worst_db,
                  {"max_relative_error": round(max(errors), 6)})


def _psnr(metric: OutputMetric, ref: Arrays, got: Arrays) -> OutputScore:
    """PSNR with the reference's value range over every sample as the peak."""
    low = min(float(r.min()) for r in ref)
    high = max(float(r.max()) for r in ref)
    peak = (high - low) or max(abs(high), 1.0)
    mse = [float(np.mean(np.square(r.astype(np.float64) - g.astype(np.float64)))) for r, g in zip(ref, got, strict=True)]
    worst = int(np.argmax(mse))
    return _score(metric, _db(peak, float(np.mean(mse))), CAP_DB, worst, _db(peak, mse[worst]), {"peak": round(peak, 6)})


def _db(peak: float, mse: float) -> float:
    return CAP_DB if mse == 0 else min(CAP_DB, 10 * math.log10(peak * peak / mse))


def _detection(metric: OutputMetric, ref: Arrays, got: Arrays, partner: tuple[Arrays, Arrays]) -> OutputScore:
    boxes, scores = ((ref, got), partner) if metric.role == "boxes" else (partner, (ref, got))
    found = agreement(boxes[0], scores[0], boxes[1], scores[1])
    worst = int(np.argmin(found.per_sample))
    detail = {"confident_reference": float(found.reference), "confident_candidate": float(found.candidate),
              "agreeing": float(found.agreeing), "iou_threshold": IOU, "score_tolerance": SCORE_TOLERANCE}
    if not math.isnan(found.mean_iou):
        detail["mean_iou"] = round(found.mean_iou, 4)
    return _score(metric, found.points, 100.0, worst, found.per_sample[worst], detail)


def _score(metric: OutputMetric, value: float, reference: float, worst: int, worst_value: float,
           detail: dict[str, float] | None = None) -> OutputScore:
    return OutputScore(metric.output, metric.metric, metric.title, metric.unit, round(value, 4), reference, metric.why,
                       worst, round(worst_value, 4), detail or {})


def _hits(outputs: Arrays, labels: np.ndarray) -> list[np.ndarray]:
    hits, start = [], 0
    for o in outputs:
        predicted = np.argmax(o.reshape(o.shape[0], -1), -1)
        hits.append(predicted == labels[start:start + len(predicted)])
        start += len(predicted)
    return hits


def _accuracy(hits: list[np.ndarray]) -> float:
    return round(100.0 * float(np.mean(np.concatenate(hits))), 4) if hits else 0.0
