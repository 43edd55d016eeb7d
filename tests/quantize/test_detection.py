"""Confident-detection agreement: what a detector's user sees, not the background anchors."""

from __future__ import annotations

import numpy as np

from quantize.detection import agreement, pair_problem


def _detector_outputs(seed: int, anchors: int = 200) -> tuple[np.ndarray, np.ndarray]:
    """Boxes (corners, non-overlapping grid) and softmax scores where 10% of anchors are confident faces."""
    rng = np.random.default_rng(seed)
    x = np.arange(anchors, dtype=np.float32)[:, None]
    boxes = np.concatenate([x, x * 0, x + 0.8, x * 0 + 0.8], axis=1)[None]
    face = np.where(rng.random(anchors) < 0.1, rng.uniform(0.6, 0.95, anchors), rng.uniform(0.0, 0.3, anchors))
    scores = np.stack([1 - face, face], axis=-1)[None].astype(np.float32)
    return boxes.astype(np.float32), scores


def test_background_anchors_do_not_hide_lost_faces() -> None:
    boxes, scores = _detector_outputs(0)
    lost = scores.copy()
    faces = np.where(scores[0, :, 1] >= 0.5)[0]
    lost[0, faces[: len(faces) // 2]] = [0.9, 0.1]  # half the faces gone: 95% of anchors still agree
    found = agreement([boxes], [scores], [boxes], [lost])
    assert found.reference == len(faces) and found.agreeing == len(faces) - len(faces) // 2
    assert 60.0 < found.points < 70.0  # 2 x kept / (all + kept)


def test_quantized_scores_that_no_longer_sum_to_one_are_still_softmax_scores() -> None:
    boxes, scores = _detector_outputs(1)
    stepped = np.round(scores * 255) / 255 + 0.004  # uint8 steps: rows sum to ~1.008, not 1
    assert agreement([boxes], [scores], [boxes], [stepped]).points == 100.0


def test_moved_boxes_and_changed_scores_count_against_agreement() -> None:
    boxes, scores = _detector_outputs(2)
    moved, rescored = boxes.copy(), scores.copy()
    moved[..., [0, 2]] += 0.2  # IoU 0.6 < 0.9: the same face, but not the same box
    rescored[..., 1] = np.where(scores[..., 1] >= 0.5, scores[..., 1] - 0.2, scores[..., 1])
    rescored[..., 0] = 1 - rescored[..., 1]
    assert agreement([boxes], [scores], [moved], [scores]).points == 0.0
    assert agreement([boxes], [scores], [boxes], [rescored]).agreeing == 0


def test_a_pair_without_confident_predictions_or_probabilities_is_not_scored_as_detections() -> None:
    boxes, scores = _detector_outputs(3)
    assert pair_problem([boxes], [scores]) is None
    assert "no prediction reaches score 0.5" in str(pair_problem([boxes], [scores * 0.4]))
    assert "not probabilities" in str(pair_problem([boxes], [scores * 3.0]))
