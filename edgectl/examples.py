"""Small ONNX models built in code, for the demo, tests and benchmarks (no downloads)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["tiny_classifier"]


def tiny_classifier(path: Path, classes: int = 10, size: int = 32, seed: int = 0, opset: int = 17,
                    extra_matmuls: int = 0) -> Path:
    """An image classifier: Conv-Relu-Conv-Relu-GlobalAveragePool-Gemm-Softmax on 1x3xSIZExSIZE.

    ``extra_matmuls`` appends square MatMul layers to make the model slower without changing
    what it is (used to build a "same model, N times slower" variant)."""
    rng = np.random.default_rng(seed)

    def w(*shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32))

    inits = [w(16, 3, 3, 3), w(16), w(32, 16, 3, 3), w(32), w(classes, 32), w(classes)]
    names = ["conv1_w", "conv1_b", "conv2_w", "conv2_b", "fc_w", "fc_b"]
    for tensor, name in zip(inits, names, strict=False):
        tensor.name = name
    nodes = [
        helper.make_node("Conv", ["image", "conv1_w", "conv1_b"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "conv2_w", "conv2_b"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["feat"]),
    ]
    last = "feat"
    for i in range(extra_matmuls):
        weight = numpy_helper.from_array((np.eye(32) + rng.standard_normal((32, 32)) * 1e-3).astype(np.float32), f"mm{i}_w")
        inits.append(weight)
        nodes.append(helper.make_node("MatMul", [last, weight.name], [f"mm{i}"]))
        last = f"mm{i}"
    nodes += [
        helper.make_node("Gemm", [last, "fc_w", "fc_b"], ["logits"], transB=1),
        helper.make_node("Softmax", ["logits"], ["probabilities"], axis=1),
    ]
    graph = helper.make_graph(
        nodes, "tiny_classifier",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [1, classes])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="edgectl-examples")
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path
