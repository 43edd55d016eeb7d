"""Rough FLOPs per node from inferred shapes: enough to say where the work is, not a benchmark."""

from __future__ import annotations

import math

import onnx

__all__ = ["estimate_flops"]


def _shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    graph = model.graph
    shapes: dict[str, list[int]] = {}
    for info in list(graph.input) + list(graph.value_info) + list(graph.output):
        dims = info.type.tensor_type.shape.dim
        # unknown (symbolic) dims count as 1: the estimate is a share, not an absolute figure
        shapes[info.name] = [d.dim_value if d.HasField("dim_value") else 1 for d in dims]
    for init in graph.initializer:
        shapes[init.name] = list(init.dims)
    return shapes


def estimate_flops(model: onnx.ModelProto) -> list[int]:
    """Estimated floating-point operations of each top-level node (multiply-add = 2)."""
    shapes = _shapes(model)
    return [_node_flops(node, shapes) for node in model.graph.node]


def _node_flops(node: onnx.NodeProto, shapes: dict[str, list[int]]) -> int:
    out = shapes.get(node.output[0]) if node.output else None
    out_elems = math.prod(out) if out is not None else 0
    if node.op_type in ("Conv", "ConvTranspose", "ConvInteger", "QLinearConv") and len(node.input) > 1:
        weight = shapes.get(node.input[1 if node.op_type != "QLinearConv" else 3])
        if weight and len(weight) > 2:
            per_output = weight[1] * math.prod(weight[2:])
            if node.op_type == "ConvTranspose":  # work scales with the input, not the output
                x = shapes.get(node.input[0], [])
                return 2 * math.prod(x) * weight[1] * math.prod(weight[2:]) if x else 0
            return 2 * out_elems * per_output
    if node.op_type in ("MatMul", "Gemm", "MatMulInteger", "QLinearMatMul"):
        a = shapes.get(node.input[0])
        if a:
            k = a[0] if node.op_type == "Gemm" and _attr(node, "transA") else a[-1]
            return 2 * out_elems * k
    return out_elems


def _attr(node: onnx.NodeProto, name: str) -> int:
    return next((a.i for a in node.attribute if a.name == name), 0)
