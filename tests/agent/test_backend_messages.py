"""A backend that fails says why in full: OpenVINO's reason comes after a "Exception from src/..." line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from agent.catalog import Candidate
from agent.hardware import probe_hardware
from agent.selection import select_backend
from edgecore.errors import OperationFailed


def _conv_over_any_size(path: Path) -> Path:
    """A 3x3 convolution over a fully dynamic image: a 1x1 image is too small for it."""
    weights = numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["image", "w"], ["out"])], "conv",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, "H", "W"])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)], initializer=[weights],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_an_openvino_failure_keeps_the_runtime_reason(tmp_path: Path) -> None:
    pytest.importorskip("openvino", reason="OpenVINO is not installed")
    model = _conv_over_any_size(tmp_path / "conv.onnx")
    with pytest.raises(OperationFailed) as failed:
        select_backend(
            model, hardware=probe_hardware(Path("/")), allowed_providers=None,
            golden={"image": np.zeros((1, 3, 1, 1), np.float32)}, expected={"out": np.zeros((1, 4, 1, 1), np.float32)},
            cache_dir=tmp_path, time_budget_s=0.2, remeasure=True, candidates=[Candidate("openvino", "CPU")],
        )
    message = str(failed.value)
    assert "\n" not in message
    assert "Exception from src/" in message and "Convolution node" in message, message
