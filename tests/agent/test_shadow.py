"""Agreement between two models' answers: per sample, top-1 for classifiers, tolerance otherwise."""

from __future__ import annotations

import numpy as np

from agent.shadow import MIN_SAMPLES, measure_agreement, shadow_inputs
from edgecore.backends import TensorSpec

SPEC = [TensorSpec("x", "float32", [1, 4])]


def test_classifier_outputs_agree_on_top1_per_sample() -> None:
    old = lambda feed: {"p": np.array([[0.1, 0.9], [0.8, 0.2], [0.6, 0.4]])}  # noqa: E731
    new = lambda feed: {"p": np.array([[0.2, 0.8], [0.3, 0.7], [0.55, 0.45]])}  # noqa: E731
    result = measure_agreement(old, new, [{"x": np.zeros((3, 4), np.float32)}])
    assert (result.samples, round(result.agreement, 3)) == (3, 0.667)
    assert "differ on 1 of 3" in result.first_difference


def test_regression_outputs_agree_within_tolerance_and_shape_changes_disagree() -> None:
    old = lambda feed: {"y": np.array([[1.0], [2.0]], np.float32)}  # noqa: E731
    close = lambda feed: {"y": np.array([[1.00001], [2.5]], np.float32)}  # noqa: E731
    assert measure_agreement(old, close, [{"x": np.zeros((2, 4), np.float32)}]).agreement == 0.5
    reshaped = lambda feed: {"y": np.zeros((2, 2), np.float32)}  # noqa: E731
    result = measure_agreement(old, reshaped, [{"x": np.zeros((2, 4), np.float32)}])
    assert result.agreement == 0 and "shape [2, 1] became [2, 2]" in result.first_difference
    renamed = lambda feed: {"z": np.zeros((2, 1), np.float32)}  # noqa: E731
    assert "no common outputs" in measure_agreement(old, renamed, [{"x": np.zeros((2, 4), np.float32)}]).first_difference


def test_inputs_are_golden_then_live_then_synthetic_up_to_the_minimum() -> None:
    golden = {"x": np.ones((1, 4), np.float32)}
    # a request of another signature is skipped
    live: list[dict[str, np.ndarray]] = [{"x": np.full((1, 4), 2, np.float32)}, {"other": np.zeros(1)}]
    feeds, n_live = shadow_inputs(golden, live, SPEC)
    assert n_live == 1 and len(feeds) == MIN_SAMPLES
    assert feeds[0] is golden and feeds[1] is live[0]
    assert all(f["x"].shape == (1, 4) and f["x"].dtype == np.float32 for f in feeds)
    again, _ = shadow_inputs(golden, live, SPEC)
    assert all(np.array_equal(a["x"], b["x"]) for a, b in zip(feeds, again, strict=False))  # reproducible


def test_string_models_get_string_inputs_and_agree_on_equal_text() -> None:
    specs = [TensorSpec("text", "object", ["N"])]
    feeds, _ = shadow_inputs({"text": np.array(["cat", "dog"])}, [{"text": np.array(["x"], dtype=object)}], specs)
    assert all(f["text"].dtype.kind in "UO" for f in feeds) and sum(len(f["text"]) for f in feeds) >= MIN_SAMPLES
    upper = np.vectorize(lambda t: str(t).upper(), otypes=[object])
    old = lambda feed: {"name": upper(feed["text"])}  # noqa: E731
    new = lambda feed: {"name": np.where(feed["text"] == "dog", "CAT", upper(feed["text"]))}  # noqa: E731
    result = measure_agreement(old, new, [{"text": np.array(["cat", "dog"])}])
    assert (result.samples, result.agreement) == (1, 0.0)  # one batch without a second axis counts as one sample
    result = measure_agreement(old, new, [{"text": np.array([["cat"], ["dog"]])}])
    assert (result.samples, result.agreement) == (2, 0.5)
