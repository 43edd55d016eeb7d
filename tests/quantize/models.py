"""Tiny float models generated with onnx.helper for the quantize tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["save", "sensitive_mlp", "tiny_cnn"]


def _init(name: str, array: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(array.astype(np.float32), name)


def tiny_cnn(opset: int = 13, seed: int = 0) -> onnx.ModelProto:
    """Conv-Relu-Conv-Relu-GlobalAveragePool-Flatten-Gemm on a [1,3,16,16] image, 10 classes."""
    rng = np.random.default_rng(seed)
    inits = [
        _init("w1", rng.normal(0, 0.3, (8, 3, 3, 3))), _init("b1", rng.normal(0, 0.1, 8)),
        _init("w2", rng.normal(0, 0.2, (8, 8, 3, 3))), _init("b2", rng.normal(0, 0.1, 8)),
        _init("w3", rng.normal(0, 0.3, (10, 8))), _init("b3", rng.normal(0, 0.1, 10)),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], "conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], "relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], "conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"], "relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["p"], "pool"),
        helper.make_node("Flatten", ["p"], ["f"], "flatten"),
        helper.make_node("Gemm", ["f", "w3", "b3"], ["logits"], "fc", transB=1),
    ]
    graph = helper.make_graph(nodes, "tiny_cnn",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def sensitive_mlp(seed: int = 0, regression: bool = False) -> onnx.ModelProto:
    """An MLP whose hidden layer has one huge outlier unit: per-tensor INT8 crushes the other units.

    The next layer nearly ignores the outlier, so the output depends on the crushed units: keeping
    that layer float is the only way to get the accuracy back. `regression` reshapes the output to
    [1,2,5] so that the metric is cosine similarity rather than top-1 agreement.
    """
    rng = np.random.default_rng(seed)
    w0 = rng.normal(0, 0.3, (16, 16))
    w1 = rng.normal(0, 1.0, (16, 32))
    w1[:, 0] *= 2000.0  # the outlier unit
    w2 = rng.normal(0, 1.0, (32, 16))
    w2[0, :] = 1e-5
    w3, w4 = rng.normal(0, 0.3, (16, 16)), rng.normal(0, 0.3, (16, 10))
    inits = [_init("w0", w0), _init("w1", w1), _init("w2", w2), _init("w3", w3), _init("w4", w4)]
    nodes = [
        helper.make_node("MatMul", ["x", "w0"], ["h0"], "mm0"),
        helper.make_node("Relu", ["h0"], ["r0"], "relu0"),
        helper.make_node("MatMul", ["r0", "w1"], ["h"], "mm1"),
        helper.make_node("MatMul", ["h", "w2"], ["h2"], "mm2"),
        helper.make_node("Relu", ["h2"], ["r2"], "relu2"),
        helper.make_node("MatMul", ["r2", "w3"], ["h3"], "mm3"),
        helper.make_node("MatMul", ["h3", "w4"], ["y" if not regression else "y10"], "mm4"),
    ]
    if regression:
        inits.append(numpy_helper.from_array(np.array([1, 2, 5], np.int64), "shape"))
        nodes.append(helper.make_node("Reshape", ["y10", "shape"], ["y"], "reshape"))
    out_shape = [1, 2, 5] if regression else [1, 10]
    graph = helper.make_graph(nodes, "sensitive_mlp",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def save(model: onnx.ModelProto, path: Path) -> Path:
    """Check and save; returns the path."""
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path
