"""Detector outputs: agreement on the confident predictions, not on every (mostly background) anchor.

A detector that outputs boxes ``[N, A, 4]`` and scores ``[N, A, C]`` per anchor is compared the way
its user reads it: the predictions whose best foreground score reaches ``CONFIDENCE`` in the user's
model and in the candidate are matched greedily (same class, IoU >= ``IOU``), and a match agrees
when the two scores differ by at most ``SCORE_TOLERANCE``. Agreement is ``2 * agreeing / (confident
in reference + confident in candidate)``: a prediction lost, added, moved, relabelled or rescored
counts against it. With softmax scores (rows summing to 1, C >= 2) class 0 is background.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["CONFIDENCE", "IOU", "SCORE_TOLERANCE", "Agreement", "Pair", "agreement", "find_pairs", "pair_problem"]

CONFIDENCE = 0.5
IOU = 0.9  # the same model quantized should land on the same box, not merely overlap it
SCORE_TOLERANCE = 0.1


@dataclass(frozen=True)
class Pair:
    """The names of a detector's boxes and scores outputs."""

    boxes: str
    scores: str


@dataclass(frozen=True)
class Agreement:
    """Confident-prediction agreement over every sample, and per sample."""

    points: float
    per_sample: tuple[float, ...]
    reference: int  # confident predictions of the user's model, all samples
    candidate: int
    agreeing: int
    mean_iou: float  # over matched predictions (nan when none matched)


def find_pairs(names: list[str], first: list[np.ndarray]) -> list[Pair]:
    """Outputs shaped boxes ``[N, A, 4]`` and scores ``[N, A, C]`` with the same anchors (A >= 2)."""
    floats = {n: a for n, a in zip(names, first, strict=True) if np.issubdtype(a.dtype, np.floating) and a.ndim == 3}
    pairs: list[Pair] = []
    used: set[str] = set()
    for boxes, b in floats.items():
        if b.shape[-1] != 4 or b.shape[1] < 2 or boxes in used:
            continue
        scores = next((n for n, a in floats.items() if n not in used | {boxes} and a.shape[:2] == b.shape[:2]
                       and a.shape[-1] != 4), None)
        if scores is not None:
            pairs.append(Pair(boxes, scores))
            used |= {boxes, scores}
    return pairs


def pair_problem(boxes: list[np.ndarray], scores: list[np.ndarray]) -> str | None:
    """Why the pair cannot be scored as detections on these reference outputs (None when it can)."""
    if any(s.min() < 0 or s.max() > 1 for s in scores):
        return "its scores are not probabilities in [0, 1]"
    softmax = _softmax(scores)
    confident = [_foreground(s, softmax)[0] >= CONFIDENCE for s in scores]
    if not any(c.any() for c in confident):
        return f"no prediction reaches score {CONFIDENCE} on these samples"
    if _box_format(boxes, confident) is None:
        return "its boxes are neither corners nor centre/size (encoded offsets?)"
    return None


def agreement(ref_boxes: list[np.ndarray], ref_scores: list[np.ndarray], got_boxes: list[np.ndarray],
              got_scores: list[np.ndarray]) -> Agreement:
    """Agreement of the candidate's confident predictions with the reference's, sample by sample."""
    softmax = _softmax(ref_scores)  # the user's model says what the scores are; a quantized softmax sums to ~1
    confident = [_foreground(s, softmax)[0] >= CONFIDENCE for s in ref_scores]
    corners = _box_format(ref_boxes, confident) != "centre"
    per_sample, ref_total, got_total, agree_total, ious = [], 0, 0, 0, []
    for rb, rs, gb, gs in zip(ref_boxes, ref_scores, got_boxes, got_scores, strict=True):
        for batch in range(rb.shape[0]):
            ref = _confident(rb[batch], rs[batch], corners, softmax)
            got = _confident(gb[batch], gs[batch], corners, softmax)
            agreeing, matched = _match(ref, got)
            total = len(ref[0]) + len(got[0])
            per_sample.append(100.0 if total == 0 else 200.0 * agreeing / total)
            ref_total, got_total, agree_total = ref_total + len(ref[0]), got_total + len(got[0]), agree_total + agreeing
            ious += matched
    points = 100.0 if ref_total + got_total == 0 else 200.0 * agree_total / (ref_total + got_total)
    return Agreement(round(points, 6), tuple(per_sample), ref_total, got_total, agree_total,
                     float(np.mean(ious)) if ious else float("nan"))


Detections = tuple[np.ndarray, np.ndarray, np.ndarray]  # corner boxes [K, 4], classes [K], scores [K]


def _softmax(scores: list[np.ndarray]) -> bool:
    """True when the scores are a softmax over C >= 2 classes (rows summing to 1): class 0 is then background."""
    return scores[0].shape[-1] >= 2 and all(np.allclose(s.sum(-1), 1.0, atol=1e-3) for s in scores)


def _foreground(scores: np.ndarray, softmax: bool) -> tuple[np.ndarray, np.ndarray]:
    """Best foreground score and class per anchor (class 0 is background for softmax scores)."""
    fg = scores[..., 1:] if softmax else scores
    return fg.max(-1), fg.argmax(-1) + (1 if softmax else 0)


def _box_format(boxes: list[np.ndarray], confident: list[np.ndarray]) -> str | None:
    """"corners" (x1, y1, x2, y2), "centre" (cx, cy, w, h) or None, from the reference's confident boxes."""
    chosen = np.concatenate([b[c] for b, c in zip(boxes, confident, strict=True)]) if confident else np.zeros((0, 4))
    if len(chosen) == 0:
        return "corners"
    ordered = np.mean((chosen[:, 2] >= chosen[:, 0]) & (chosen[:, 3] >= chosen[:, 1]))
    if ordered >= 0.95:
        return "corners"
    return "centre" if np.mean((chosen[:, 2] >= 0) & (chosen[:, 3] >= 0)) >= 0.95 else None


def _confident(boxes: np.ndarray, scores: np.ndarray, corners: bool, softmax: bool) -> Detections:
    best, classes = _foreground(scores, softmax)
    keep = best >= CONFIDENCE
    chosen = boxes[keep].astype(np.float64)
    if not corners:
        centre, size = chosen[:, :2], chosen[:, 2:] / 2
        chosen = np.concatenate([centre - size, centre + size], axis=1)
    return chosen, classes[keep], best[keep].astype(np.float64)


def _match(ref: Detections, got: Detections) -> tuple[int, list[float]]:
    """Greedy matching, the most confident reference prediction first: (agreeing count, IoUs of matches)."""
    iou = _iou(ref[0], got[0])
    iou[ref[1][:, None] != got[1][None, :]] = 0.0
    used = np.zeros(len(got[0]), bool)
    agreeing, ious = 0, []
    for r in np.argsort(-ref[2], kind="stable"):
        if not len(got[0]):
            break
        candidates = np.where(used, -1.0, iou[r])
        g = int(np.argmax(candidates))
        if candidates[g] < IOU:
            continue
        used[g] = True
        ious.append(float(candidates[g]))
        agreeing += int(abs(ref[2][r] - got[2][g]) <= SCORE_TOLERANCE)
    return agreeing, ious


def _iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if not len(a) or not len(b):
        return np.zeros((len(a), len(b)))
    lo = np.maximum(a[:, None, :2], b[None, :, :2])
    hi = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(hi - lo, 0, None), axis=-1)
    union = _area(a)[:, None] + _area(b)[None, :] - inter
    return np.where(union > 0, inter / np.maximum(union, 1e-12), 0.0)


def _area(boxes: np.ndarray) -> np.ndarray:
    return np.asarray(np.prod(np.clip(boxes[:, 2:] - boxes[:, :2], 0, None), axis=-1))
