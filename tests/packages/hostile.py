"""Models that load fine and then attack whoever runs them: one allocates ~20 GiB, one never returns.

Both take the tiny classifier's input (``image`` 1x3x8x8 float) so they pass the ONNX checks and
the signature checks, and misbehave only when run.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["endless_model", "huge_allocation_model", "slow_model"]

_IMAGE = [1, 3, 8, 8]


def _save(path: Path, graph: onnx.GraphProto) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def huge_allocation_model(path: Path, gib: int = 20) -> Path:
    """Expand the input to ``gib`` GiB of floats: the shape is a constant, the data depends on the input."""
    side = int((gib * 2**30 / 4 / 3) ** 0.5)
    shape = numpy_helper.from_array(np.array([1, 3, side, side], np.int64), "huge_shape")
    pick = numpy_helper.from_array(np.array([0], np.int64), "pick")
    graph = helper.make_graph(
        [
            helper.make_node("Slice", ["image", "pick", "one", "three"], ["corner"]),  # 1x3x1x8 -> keep it small first
            helper.make_node("ReduceMean", ["corner"], ["cell"], keepdims=1),
            helper.make_node("Expand", ["cell", "huge_shape"], ["huge"]),
            helper.make_node("ReduceMean", ["huge"], ["probabilities"], axes=[2, 3], keepdims=0),
        ],
        path.stem,
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, _IMAGE)],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [1, 3])],
        initializer=[shape, pick, numpy_helper.from_array(np.array([1], np.int64), "one"),
                     numpy_helper.from_array(np.array([3], np.int64), "three")],
    )
    return _save(path, graph)


def endless_model(path: Path, trips: int = 2**62) -> Path:
    """A Loop with a trip count of 2**62 whose body adds one to a counter: it never returns."""
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Add", ["acc_in", "step"], ["acc_out"]),
        ],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [1, 3, 8, 8])],
        initializer=[numpy_helper.from_array(np.array(1.0, np.float32), "step")],
    )
    graph = helper.make_graph(
        [
            helper.make_node("Loop", ["trips", "keep_going", "image"], ["looped"], body=body),
            helper.make_node("ReduceMean", ["looped"], ["probabilities"], axes=[2, 3], keepdims=0),
        ],
        path.stem,
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, _IMAGE)],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [1, 3])],
        initializer=[numpy_helper.from_array(np.array(trips, np.int64), "trips"),
                     numpy_helper.from_array(np.array(True), "keep_going")],
    )
    return _save(path, graph)


def slow_model(path: Path, trips: int = 400) -> Path:
    """Correct outputs, slowly: a Loop of ``trips`` 256x256 matrix products beside a per-channel mean.

    Each run takes ``trips`` products (about a millisecond each on one core), so a test can catch
    the agent while it runs this model, or give it a deadline shorter than its measurement."""
    state = numpy_helper.from_array(np.eye(256, dtype=np.float32), "state")
    weights = numpy_helper.from_array(np.eye(256, dtype=np.float32) * 0.5, "w")
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("MatMul", ["acc_in", "w"], ["product"]),
            helper.make_node("Tanh", ["product"], ["acc_out"]),
        ],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [256, 256])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [256, 256])],
        initializer=[weights],
    )
    graph = helper.make_graph(
        [
            helper.make_node("Loop", ["trips", "keep_going", "state"], ["looped"], body=body),
            helper.make_node("ReduceMean", ["looped"], ["tiny"], keepdims=0),
            helper.make_node("ReduceMean", ["image"], ["means"], axes=[2, 3], keepdims=0),
            helper.make_node("Add", ["means", "tiny"], ["probabilities"]),
        ],
        path.stem,
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, _IMAGE)],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [1, 3])],
        initializer=[numpy_helper.from_array(np.array(trips, np.int64), "trips"),
                     numpy_helper.from_array(np.array(True), "keep_going"), state],
    )
    return _save(path, graph)
