"""Fix dynamic input shapes (``--static-shape input=1x3x224x224``) and re-run shape inference."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import onnx

from agent.errors import ConfigError, ModelError

__all__ = ["fix_input_shapes", "parse_static_shapes"]


def parse_static_shapes(specs: Iterable[str]) -> dict[str, tuple[int, ...]]:
    """``["input=1x3x224x224"]`` -> ``{"input": (1, 3, 224, 224)}``; ConfigError names the bad one."""
    shapes: dict[str, tuple[int, ...]] = {}
    for spec in specs:
        name, sep, dims = spec.partition("=")
        try:
            values = tuple(int(d) for d in dims.lower().split("x")) if dims else ()
        except ValueError:
            values = ()
        if not sep or not name or not values or any(v <= 0 for v in values):
            raise ConfigError(f"--static-shape {spec!r}: expected NAME=DIMS with positive dims, e.g. input=1x3x224x224")
        shapes[name] = values
    return shapes


def fix_input_shapes(model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]]) -> onnx.ModelProto:
    """A copy of ``model`` with the named inputs fixed to ``shapes`` and shapes re-inferred."""
    from onnxruntime.tools.onnx_model_utils import make_input_shape_fixed

    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    inputs = {i.name: i for i in fixed.graph.input}
    for name, dims in shapes.items():
        if name not in inputs:
            raise ConfigError(f"--static-shape {name}: no such input; inputs are {', '.join(inputs)}")
        rank = len(inputs[name].type.tensor_type.shape.dim)
        if rank and rank != len(dims):
            raise ConfigError(f"--static-shape {name}: input has rank {rank}, got {len(dims)} dims")
        try:
            make_input_shape_fixed(fixed.graph, name, list(dims))
        except ValueError as exc:  # a dim that is already fixed to another value
            raise ConfigError(f"--static-shape {name}: {exc}") from exc
    del fixed.graph.value_info[:]  # stale dynamic shapes would fight the new ones
    try:
        return onnx.shape_inference.infer_shapes(fixed, strict_mode=True)
    except onnx.shape_inference.InferenceError as exc:
        raise ModelError(f"shapes {dict(shapes)} do not fit the model: {str(exc).splitlines()[0]}") from exc
