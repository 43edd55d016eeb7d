"""Memory a backend takes for a model, measured in a fresh child (the tie-breaker of backend selection)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from agent.catalog import Candidate
from agent.footprint import footprint_mb
from tests.agent.test_selection import conv_model

FEEDS = {"x": np.zeros((1, 3, 16, 16), np.float32)}


def test_a_loaded_model_takes_memory_and_the_figure_repeats(tmp_path: Path) -> None:
    model = conv_model(tmp_path / "conv.onnx")
    first = footprint_mb(Candidate("onnxruntime", "CPUExecutionProvider"), model, FEEDS)
    again = footprint_mb(Candidate("onnxruntime", "CPUExecutionProvider"), model, FEEDS)
    assert first is not None and again is not None and first > 0
    assert abs(first - again) <= max(0.2 * first, 2.0)  # a fresh process each time: nothing carried over


def test_a_candidate_that_cannot_load_has_no_figure(tmp_path: Path) -> None:
    assert footprint_mb(Candidate("openvino", "NO_SUCH_DEVICE"), conv_model(tmp_path / "conv.onnx"), FEEDS) is None
