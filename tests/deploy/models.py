"""Models that load fine but misbehave when they run: built in code for the HEALTH tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["crashing_model", "nan_model"]


def _save(path: Path, nodes: list[onnx.NodeProto], output_shape: list[int], inits: list[onnx.TensorProto]) -> Path:
    graph = helper.make_graph(
        nodes, path.stem, [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, output_shape)], initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def nan_model(path: Path) -> Path:
    """image + Sqrt(-1): loads, runs, and answers NaN for every input."""
    minus_one = numpy_helper.from_array(np.array([-1.0], np.float32), "minus_one")
    return _save(path, [
        helper.make_node("Sqrt", ["minus_one"], ["nan"]),
        helper.make_node("Add", ["image", "nan"], ["probabilities"]),
    ], [1, 3, 8, 8], [minus_one])


def crashing_model(path: Path) -> Path:
    """Gathers element 500 of a 192-element row: loads, then fails on every inference."""
    index = numpy_helper.from_array(np.array([500], np.int64), "index")
    return _save(path, [
        helper.make_node("Flatten", ["image"], ["flat"]),
        helper.make_node("Gather", ["flat", "index"], ["probabilities"], axis=1),
    ], [1, 1], [index])
