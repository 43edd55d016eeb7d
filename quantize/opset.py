"""Raise a model's opset before per-channel QDQ (DequantizeLinear `axis` needs opset 13)."""

from __future__ import annotations

from collections.abc import Callable

import onnx
from onnx import version_converter

from edgecore.errors import ModelError

__all__ = ["PER_CHANNEL_OPSET", "QDQ_OPSET", "default_opset", "upgrade_opset"]

PER_CHANNEL_OPSET = 13  # DequantizeLinear gained `axis` in opset 13
QDQ_OPSET = 10  # QuantizeLinear/DequantizeLinear exist from opset 10


def default_opset(model: onnx.ModelProto) -> int:
    """The version of the default (ai.onnx) domain the model imports."""
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return int(entry.version)
    return 1


Converter = Callable[[onnx.ModelProto, int], onnx.ModelProto]


def upgrade_opset(model: onnx.ModelProto, minimum: int,
                  convert: Converter = version_converter.convert_version) -> tuple[onnx.ModelProto, str | None]:
    """Return the model at opset >= minimum and a note of what was done; ModelError when impossible.

    `convert` is onnx's version converter; tests pass one that fails for a chosen op.
    """
    current = default_opset(model)
    if current >= minimum:
        return model, None
    try:
        converted = convert(model, minimum)
        if current < _RESIZE_COORDINATES <= minimum:
            _keep_upsample_coordinates(converted.graph)
        onnx.checker.check_model(converted)
        converted = onnx.shape_inference.infer_shapes(converted)
    except Exception as exc:  # onnx raises RuntimeError/ValidationError/ConvertError alike
        raise ModelError(f"cannot raise opset {current} -> {minimum}: {_why(model, exc)}") from exc
    return converted, f"opset raised {current} -> {minimum} with onnx.version_converter"


_RESIZE_COORDINATES = 11  # Resize gained coordinate_transformation_mode, default half_pixel


def _keep_upsample_coordinates(graph: onnx.GraphProto) -> None:
    """Give every Resize the coordinates Upsample and Resize-10 had (asymmetric, nearest rounds down).

    onnx's converter turns them into Resize-11+ without the attribute, so they default to half_pixel
    and move every output pixel. Called only when the model predates opset 11: all its Resize nodes
    come from there.
    """
    for node in graph.node:
        for attr in node.attribute:
            for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                _keep_upsample_coordinates(sub)
        if node.op_type != "Resize":
            continue
        have = {a.name for a in node.attribute}
        if "coordinate_transformation_mode" not in have:
            node.attribute.append(onnx.helper.make_attribute("coordinate_transformation_mode", "asymmetric"))
        if "nearest_mode" not in have:
            node.attribute.append(onnx.helper.make_attribute("nearest_mode", "floor"))


def _why(model: onnx.ModelProto, exc: Exception) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    # Upsample was removed in opset 10 and the converter has no adapter to Resize.
    if any(node.op_type == "Upsample" for node in model.graph.node):
        return f"the model uses Upsample, which onnx.version_converter cannot convert ({text})"
    return text
