"""Input shapes: what counts as dynamic, the ``--static-shape`` to suggest, and fixing them.

A dim is static only when it has a positive ``dim_value``: ``-1`` and ``0`` (as some exporters
write), a ``dim_param`` and a missing dim are all dynamic, everywhere in the analysis.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import onnx

from edgecore.errors import ConfigError, ModelError, listing

__all__ = [
    "dims_text",
    "dynamic_inputs",
    "fix_input_shapes",
    "is_static",
    "is_static_dim",
    "normalise_dims",
    "parse_static_shapes",
    "static_shape_hint",
]


def is_static_dim(dim: onnx.TensorShapeProto.Dimension) -> bool:
    """True for a positive ``dim_value``; ``-1``, ``0``, ``dim_param`` and unset are dynamic."""
    return dim.HasField("dim_value") and dim.dim_value > 0


def is_static(info: onnx.ValueInfoProto) -> bool:
    """A tensor whose rank and every dim are known (scalars are static)."""
    tensor = info.type.tensor_type
    return info.type.HasField("tensor_type") and tensor.HasField("shape") and all(
        is_static_dim(d) for d in tensor.shape.dim)


def dims_text(info: onnx.ValueInfoProto) -> str:
    """``1x3x?x?`` style: dynamic dims show their ``dim_param`` or ``?``."""
    dims = info.type.tensor_type.shape.dim
    if not info.type.tensor_type.HasField("shape"):
        return "unknown rank"
    return "x".join(str(d.dim_value) if is_static_dim(d) else (d.dim_param or "?") for d in dims) or "scalar"


def _graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    initializers = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in initializers and i.type.HasField("tensor_type")]


def dynamic_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """Graph inputs (initializers excluded) with any dynamic dim."""
    return [i for i in _graph_inputs(model) if not is_static(i)]


def static_shape_hint(model: onnx.ModelProto) -> str:
    """The ``--static-shape`` flags to fix every dynamic input: batch as 1, other unknowns named.

    E.g. ``--static-shape x=1x3xHxW`` for ``[-1,3,-1,-1]``; the caller says which names to replace.
    Two dims share a name only when the model says they are one (the same ``dim_param``).
    """
    flags = []
    named: dict[str, str] = {}  # dim_param -> its placeholder
    for info in dynamic_inputs(model):
        dims = info.type.tensor_type.shape.dim
        parts = []
        for k, dim in enumerate(dims):
            if is_static_dim(dim):
                parts.append(str(dim.dim_value))
            elif k == 0:
                parts.append("1")
            else:
                parts.append(_placeholder(dim, k, len(dims), named))
        flags.append(f"--static-shape {info.name}={'x'.join(parts) or '1'}")
    return " ".join(flags)


def _placeholder(dim: onnx.TensorShapeProto.Dimension, k: int, rank: int, named: dict[str, str]) -> str:
    param = dim.dim_param if dim.dim_param.isidentifier() and not dim.dim_param.lower().startswith("unk") else ""
    if param in named:
        return named[param]
    # NCHW images: the last two dims are height and width
    base = param or ({rank - 2: "H", rank - 1: "W"}.get(k, f"D{k}") if rank == 4 else f"D{k}")
    taken = set(named.values())
    name, n = base, 2
    while name in taken:
        name, n = f"{base}{n}", n + 1
    named[param or f"#{len(named)}"] = name
    return name


def normalise_dims(model: onnx.ModelProto) -> None:
    """Turn ``-1``/``0`` dim values (invalid in ONNX, written by some exporters) into named dynamic dims."""
    graph = model.graph
    for info in list(graph.input) + list(graph.output) + list(graph.value_info):
        if not info.type.HasField("tensor_type"):
            continue
        for k, dim in enumerate(info.type.tensor_type.shape.dim):
            if dim.HasField("dim_value") and dim.dim_value <= 0:
                dim.Clear()
                dim.dim_param = f"unk__{info.name}_{k}"


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
            raise ConfigError(f"--static-shape {name}: no such input; inputs are {listing(inputs)}")
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
