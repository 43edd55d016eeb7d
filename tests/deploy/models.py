"""Models built in code for the deploy tests: ones that load fine but misbehave when they run (HEALTH), and the
parts of a realistic pipeline (a detector whose box feeds a classifier through an ONNX crop-and-resize graph)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["crashing_model", "crop_resize_graph", "nan_model", "tiny_detector"]


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


def _model(path: Path, nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto],
           outputs: list[onnx.ValueInfoProto], inits: list[onnx.TensorProto]) -> Path:
    model = helper.make_model(helper.make_graph(nodes, path.stem, inputs, outputs, initializer=inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, path)
    return path


def tiny_detector(path: Path, size: int = 32, seed: int = 0) -> Path:
    """A one-object detector: ``image`` [1,3,S,S] -> ``boxes`` [1,4] = (y1, x1, y2, x2) normalized, y1 < y2, x1 < x2.

    Conv-Relu features, pooled, and a box head whose corners are squashed to the top-left and the
    bottom-right halves of the image, so every box is a valid crop. ``seed`` changes the weights."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)
             for name, shape, scale in (("conv_w", (8, 3, 3, 3), 0.3), ("conv_b", (8,), 0.1), ("head_w", (8, 4), 1.0),
                                        ("head_b", (4,), 0.5))]
    inits += [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("half", [0.5] * 4), ("corner", [0, 0, 0.5, 0.5]))]
    nodes = [
        helper.make_node("Conv", ["image", "conv_w", "conv_b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("ReduceMean", ["r"], ["pooled"], axes=[2, 3], keepdims=0),
        helper.make_node("MatMul", ["pooled", "head_w"], ["h"]),
        helper.make_node("Add", ["h", "head_b"], ["logits"]),
        helper.make_node("Sigmoid", ["logits"], ["unit"]),
        helper.make_node("Mul", ["unit", "half"], ["scaled"]),
        helper.make_node("Add", ["scaled", "corner"], ["boxes"]),
    ]
    return _model(path, nodes, [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, size, size])],
                  [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, 4])], inits)


def crop_resize_graph(path: Path, size: int = 32, out: int = 16) -> Path:
    """The pre-processing step between them: crop ``image`` to ``boxes`` and resize the crop to ``out`` x ``out``.

    ONNX's Resize in ``tf_crop_and_resize`` mode with the box as its region of interest (bilinear)."""
    inits = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (
        ("flat_shape", [4]), ("zero", [0]), ("two", [2]), ("four", [4]), ("sizes", [1, 3, out, out]))]
    inits += [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("lead0", [0, 0]), ("lead1", [1, 1]))]
    nodes = [
        helper.make_node("Reshape", ["boxes", "flat_shape"], ["flat"]),
        helper.make_node("Slice", ["flat", "zero", "two"], ["starts"]),
        helper.make_node("Slice", ["flat", "two", "four"], ["ends"]),
        helper.make_node("Concat", ["lead0", "starts", "lead1", "ends"], ["roi"], axis=0),
        helper.make_node("Resize", ["image", "roi", "", "sizes"], ["patch"], mode="linear",
                         coordinate_transformation_mode="tf_crop_and_resize"),
    ]
    return _model(path, nodes, [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, size, size]),
                                helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, 4])],
                  [helper.make_tensor_value_info("patch", TensorProto.FLOAT, [1, 3, out, out])], inits)
