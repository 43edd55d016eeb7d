"""Small ONNX models built in code for the target tests (no files checked in)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

IR_VERSION = 8  # what onnxruntime 1.31 and OpenVINO accept for every opset used here

Dim = int | str


def _model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto],
           inits: Sequence[onnx.TensorProto] = (), opset: int = 17, ml: bool = False) -> onnx.ModelProto:
    opsets = [helper.make_opsetid("", opset)] + ([helper.make_opsetid("ai.onnx.ml", 3)] if ml else [])
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, list(inits)), opset_imports=opsets,
                              ir_version=IR_VERSION)
    onnx.checker.check_model(model)
    return model


def _weight(name: str, shape: tuple[int, ...], seed: int) -> onnx.TensorProto:
    return numpy_helper.from_array(np.random.default_rng(seed).standard_normal(shape).astype(np.float32), name)


def conv_chain(batch: Dim = 1, opset: int = 17) -> onnx.ModelProto:
    """Conv -> Relu -> Conv -> Relu -> GlobalAveragePool -> Flatten: every op NNAPI/TensorRT/QNN take."""
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["p"], name="pool"),
        helper.make_node("Flatten", ["p"], ["y"], name="flatten"),
    ]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 8, 8])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4])],
                  [_weight("w1", (4, 3, 3, 3), 1), _weight("w2", (4, 4, 3, 3), 2)], opset=opset)


def unsupported_in_middle() -> onnx.ModelProto:
    """Four NNAPI-friendly nodes, an Erf (not in NNAPI's list), four more: three partitions."""
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["m1"], name="mm1"),
        helper.make_node("Add", ["m1", "b1"], ["a1"], name="add1"),
        helper.make_node("Relu", ["a1"], ["r1"], name="relu1"),
        helper.make_node("Mul", ["r1", "s1"], ["h1"], name="mul1"),
        helper.make_node("Erf", ["h1"], ["e"], name="erf"),
        helper.make_node("MatMul", ["e", "w2"], ["m2"], name="mm2"),
        helper.make_node("Add", ["m2", "b2"], ["a2"], name="add2"),
        helper.make_node("Sigmoid", ["a2"], ["s2"], name="sigmoid"),
        helper.make_node("Mul", ["s2", "a2"], ["y"], name="mul2"),
    ]
    inits = [_weight("w1", (8, 8), 3), _weight("b1", (8,), 4), _weight("s1", (8,), 5), _weight("w2", (8, 4), 6),
             _weight("b2", (4,), 7)]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], inits)


def with_if() -> onnx.ModelProto:
    """Relu, then an If whose branches read an outer-scope tensor, then Sigmoid and Neg."""
    then_branch = helper.make_graph([helper.make_node("Mul", ["r", "two"], ["t"], name="then_mul")], "then", [],
                                    [helper.make_tensor_value_info("t", TensorProto.FLOAT, [1, 4])])
    else_branch = helper.make_graph([helper.make_node("Neg", ["r"], ["t2"], name="else_neg")], "else", [],
                                    [helper.make_tensor_value_info("t2", TensorProto.FLOAT, [1, 4])])
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("If", ["cond"], ["branch"], name="if", then_branch=then_branch, else_branch=else_branch),
        helper.make_node("Sigmoid", ["branch"], ["s"], name="sigmoid"),
        helper.make_node("Neg", ["s"], ["y"], name="neg"),
    ]
    two = numpy_helper.from_array(np.full((1, 4), 2.0, np.float32), "two")
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
                          helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [two])


def tree_ensemble() -> onnx.ModelProto:
    """ONNX-ML TreeEnsembleClassifier behind a Relu."""
    tree = helper.make_node(
        "TreeEnsembleClassifier", ["r"], ["label", "prob"], domain="ai.onnx.ml", name="tree",
        classlabels_int64s=[0, 1], nodes_treeids=[0, 0, 0], nodes_nodeids=[0, 1, 2], nodes_featureids=[0, 0, 0],
        nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"], nodes_values=[0.5, 0.0, 0.0], nodes_truenodeids=[1, 0, 0],
        nodes_falsenodeids=[2, 0, 0], class_treeids=[0, 0], class_nodeids=[1, 2], class_ids=[0, 1],
        class_weights=[1.0, 1.0])
    return _model([helper.make_node("Relu", ["x"], ["r"], name="relu"), tree],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
                  [helper.make_tensor_value_info("label", TensorProto.INT64, [1]),
                   helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, 2])], ml=True)


def elementwise(opset: int, name: str | None = None) -> onnx.ModelProto:
    """Add -> Relu -> Softmax at any opset from 9 up."""
    nodes = [helper.make_node("Add", ["x", "x"], ["a"], name=name or "add"),
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("Softmax", ["r"], ["y"], name="softmax", axis=1)]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], opset=opset)
