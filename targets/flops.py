"""Rough FLOPs per node from inferred shapes: enough to say where the work is, not a benchmark.

A node whose count needs a dim that is not known (``-1``, ``0``, a ``dim_param``, missing) has
``None`` FLOPs: unknown, never a guess and never negative. Nodes inside If/Loop/Scan bodies count
once (both If branches are counted; a Loop body counts one iteration).
"""

from __future__ import annotations

import math

import onnx

from targets.graph import Scope

__all__ = ["estimate_flops", "share"]

Shapes = dict[str, list[int] | None]  # None: rank or some dim unknown


def _dims(info: onnx.ValueInfoProto) -> list[int] | None:
    tensor = info.type.tensor_type
    if not info.type.HasField("tensor_type") or not tensor.HasField("shape"):
        return None
    dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else -1 for d in tensor.shape.dim]
    return None if -1 in dims else dims


def _scope_shapes(all_scopes: list[Scope]) -> list[Shapes]:
    maps: list[Shapes] = []
    for scope in all_scopes:
        shapes: Shapes = dict(maps[scope.parent]) if scope.parent is not None else {}
        graph = scope.graph
        for info in list(graph.input) + list(graph.value_info) + list(graph.output):
            shapes[info.name] = _dims(info)
        for init in graph.initializer:
            shapes[init.name] = list(init.dims)
        maps.append(shapes)
    return maps


def estimate_flops(all_scopes: list[Scope]) -> list[int | None]:
    """Estimated floating-point operations of each node in flat order (multiply-add = 2)."""
    out: list[int | None] = []
    for scope, shapes in zip(all_scopes, _scope_shapes(all_scopes), strict=True):
        out += [_node_flops(node, shapes) for node in scope.graph.node]
    return out


def share(flops: list[int | None], chosen: list[bool]) -> float | None:
    """The chosen nodes' part of the total, or None when any node's count is unknown."""
    if any(f is None for f in flops):
        return None
    total = sum(f for f in flops if f is not None)
    return sum(f for f, c in zip(flops, chosen, strict=True) if c and f is not None) / total if total else 0.0


def _node_flops(node: onnx.NodeProto, shapes: Shapes) -> int | None:
    if not node.output:
        return 0
    out = shapes.get(node.output[0])
    if out is None:
        return None
    out_elems = math.prod(out)
    if node.op_type in ("Conv", "ConvTranspose", "ConvInteger", "QLinearConv") and len(node.input) > 1:
        weight = shapes.get(node.input[1 if node.op_type != "QLinearConv" else 3])
        if weight is None or len(weight) <= 2:
            return None
        if node.op_type == "ConvTranspose":  # work scales with the input, not the output
            x = shapes.get(node.input[0])
            return 2 * math.prod(x) * weight[1] * math.prod(weight[2:]) if x else None
        return 2 * out_elems * weight[1] * math.prod(weight[2:])
    if node.op_type in ("MatMul", "Gemm", "MatMulInteger", "QLinearMatMul"):
        a = shapes.get(node.input[0])
        if not a:
            return None
        k = a[0] if node.op_type == "Gemm" and _attr(node, "transA") else a[-1]
        return 2 * out_elems * k
    return out_elems


def _attr(node: onnx.NodeProto, name: str) -> int:
    return next((a.i for a in node.attribute if a.name == name), 0)
