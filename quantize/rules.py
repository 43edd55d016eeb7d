"""Structural format rules per target family: zero points, dtypes and forbidden ops."""

from __future__ import annotations

from collections.abc import Collection, Iterator

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from quantize.opset import PER_CHANNEL_OPSET, default_opset
from quantize.recipe import Family, Recipe

__all__ = ["INTEGER_OPS", "QUANT_OPS", "format_violations", "is_quantized", "weight_tensors"]

INTEGER_OPS = {"ConvInteger", "MatMulInteger", "DynamicQuantizeLinear", "QLinearConv", "QLinearMatMul",
               "QLinearAdd", "QLinearMul", "QGemm", "MatMulIntegerToFloat", "DynamicQuantizeMatMul"}
QUANT_OPS = INTEGER_OPS | {"QuantizeLinear", "DequantizeLinear"}
_WEIGHT_OPS = {"Conv", "ConvTranspose", "MatMul", "Gemm"}
# Inputs onnxruntime's QDQ quantizer quantizes with the *weight* type when they are initializers
# (operators/conv.py, gemm.py, matmul.py, norm.py); every other initializer gets the activation type.
_WEIGHT_INPUTS = {"Conv": (1,), "ConvTranspose": (1,), "Gemm": (1,), "MatMul": (0, 1),
                  "InstanceNormalization": (1,), "LayerNormalization": (1,), "BatchNormalization": (1,)}


def is_quantized(model: onnx.ModelProto) -> list[str]:
    """The quantization op types the model already contains (empty for a float model)."""
    return sorted({n.op_type for n in model.graph.node if n.op_type in QUANT_OPS})


def weight_tensors(graph: onnx.GraphProto, depth: int = 0) -> Iterator[tuple[int, TensorProto]]:
    """Every initializer and Constant-node tensor with its subgraph depth (0: the top-level graph).

    Control-flow exporters (silero-vad v5) keep every weight inside If/Loop/Scan branches.
    """
    for tensor in graph.initializer:
        yield depth, tensor
    for node in graph.node:
        for attr in node.attribute:
            if node.op_type == "Constant" and attr.HasField("t"):
                yield depth, attr.t
            subgraphs = [attr.g] if attr.HasField("g") else []
            for sub in [*subgraphs, *attr.graphs]:
                yield from weight_tensors(sub, depth + 1)


def format_violations(model: onnx.ModelProto, recipe: Recipe, kept_float: Collection[str] = ()) -> list[str]:
    """Every way the model breaks the format `recipe` promises; empty when it conforms.

    Nodes in `kept_float` were kept float32 on purpose (accuracy or target check): their weights may be.
    """
    if recipe.precision == "int8":
        return _int8_violations(model, recipe)
    if recipe.precision == "dynamic":
        ops = {n.op_type for n in model.graph.node}
        return [] if ops & {"DynamicQuantizeLinear", "MatMulInteger", "ConvInteger"} else ["no dynamic ops"]
    if recipe.precision == "fp16":
        return _fp16_violations(model, recipe, set(kept_float))
    return []


def _int8_violations(model: onnx.ModelProto, recipe: Recipe) -> list[str]:
    inits = {t.name: t for t in model.graph.initializer}
    found: list[str] = []
    ops = {n.op_type for n in model.graph.node}
    if "QuantizeLinear" not in ops:
        found.append("no QuantizeLinear node: nothing was quantized")
    for op in sorted(ops & INTEGER_OPS):
        found.append(f"{op}: QOperator/integer op in a QDQ model")
    if recipe.per_channel and default_opset(model) < PER_CHANNEL_OPSET and _has_axis(model):
        found.append(f"per-channel DequantizeLinear at opset {default_opset(model)} < {PER_CHANNEL_OPSET}")
    weights = {n.input[i] for n in model.graph.node for i in _WEIGHT_INPUTS.get(n.op_type, ()) if i < len(n.input)}
    for node in model.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            is_weight = node.op_type == "DequantizeLinear" and node.input[0] in inits and node.output[0] in weights
            found.extend(_zero_point_violations(node, inits, recipe, is_weight))
    return found


def _zero_point_violations(node: onnx.NodeProto, inits: dict[str, TensorProto], recipe: Recipe,
                           is_weight: bool) -> list[str]:
    """Weights (as onnxruntime's quantizer defines them, see _WEIGHT_INPUTS) follow the weight type; other
    constants and activations the activation type; int32 constants are biases."""
    zp_name = node.input[2] if len(node.input) > 2 else ""
    zp = numpy_helper.to_array(inits[zp_name]) if zp_name in inits else np.zeros((), np.uint8)
    if zp.dtype == np.int32:
        return [] if recipe.quantize_bias else [f"{node.name}: bias quantized to int32, target wants it float"]
    want = _wanted_type(recipe, is_weight)
    problems = []
    if zp.dtype != want:
        problems.append(f"{node.name}: zero point {zp.dtype}, target wants {want}")
    symmetric = is_weight or recipe.symmetric_activations
    if symmetric and zp.dtype == np.int8 and np.any(zp != 0):
        problems.append(f"{node.name}: non-zero int8 zero point (target wants symmetric)")
    return problems


def _wanted_type(recipe: Recipe, is_weight: bool) -> np.dtype:
    qtype = recipe.weight_type if is_weight else recipe.activation_type
    if recipe.family is Family.TENSORRT:
        return np.dtype(np.int8)
    return np.dtype(np.int8 if qtype.name == "QInt8" else np.uint8)


def _has_axis(model: onnx.ModelProto) -> bool:
    return any(a.name == "axis" for n in model.graph.node if n.op_type == "DequantizeLinear" for a in n.attribute)


def _fp16_violations(model: onnx.ModelProto, recipe: Recipe, kept_float: set[str]) -> list[str]:
    found = []
    if not any(t.data_type == TensorProto.FLOAT16 for _, t in weight_tensors(model.graph)):
        found.append("no float16 weight (initializer or Constant node, subgraphs included)")
    if recipe.keep_io_types:
        for value in list(model.graph.input) + list(model.graph.output):
            if value.type.tensor_type.elem_type == TensorProto.FLOAT16:
                found.append(f"{value.name}: graph I/O converted to float16, fp32 I/O was asked")
    inits32 = {t.name for t in model.graph.initializer if t.data_type == TensorProto.FLOAT and len(t.dims) >= 2}
    for node in model.graph.node:
        if node.op_type in _WEIGHT_OPS and node.name not in kept_float and any(i in inits32 for i in node.input):
            found.append(f"{node.name}: {node.op_type} still has float32 weights")
    return found
