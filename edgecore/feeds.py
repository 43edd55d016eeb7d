"""Inputs for running a model without real data: shapes the user gives, tensors synthesized from a signature.

``edgectl build`` and ``edge-agent probe`` refuse to guess a dynamic dimension other than the batch
(a 1x3x1x1 image means nothing to a detector); the device's first run under limits takes 1 for every
unknown dimension, because there it only has to show that the model runs within bounds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from edgecore import tensors
from edgecore.backends import TensorSpec
from edgecore.errors import UserError, listing
from edgecore.modelwire import ELEMENT_DTYPES

if TYPE_CHECKING:
    import onnx

__all__ = ["concrete_shape", "graph_inputs", "model_inputs", "parse_input_shapes", "resolve_shapes", "synthetic_feeds"]

SHAPE_FLAG = "--input-shape"


def parse_input_shapes(items: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """``["image=1x3x640x640"]`` as ``{"image": (1, 3, 640, 640)}``; a malformed item is a UserError."""
    shapes: dict[str, tuple[int, ...]] = {}
    for item in items:
        name, sep, dims = item.rpartition("=")
        try:
            shape = tuple(int(d) for d in dims.lower().split("x"))
        except ValueError:
            shape = ()
        if not sep or not name or not shape or any(d <= 0 for d in shape):
            raise UserError(f"{SHAPE_FLAG} {item!r}: expected NAME=DxDx..., e.g. image=1x3x640x640")
        if name in shapes:
            raise UserError(f"{SHAPE_FLAG}: input {name!r} given twice")
        shapes[name] = shape
    return shapes


def graph_inputs(model: onnx.ModelProto) -> list[TensorSpec]:
    """The model's real inputs from its graph (initializers excluded); unknown dims are None, symbolic ones str."""
    inits = {init.name for init in model.graph.initializer}
    specs = []
    for value in model.graph.input:
        if value.name in inits:
            continue
        tensor = value.type.tensor_type
        dims: list[int | str | None] = [
            d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else (d.dim_param or None)
            for d in tensor.shape.dim
        ]
        specs.append(TensorSpec(value.name, _dtype(tensor.elem_type), dims))
    return specs


def _dtype(elem_type: int) -> str:
    try:
        return ELEMENT_DTYPES[elem_type]
    except KeyError:
        raise UserError(f"unknown ONNX element type {elem_type}") from None


def _describe(shape: Sequence[object]) -> str:
    return "[" + ",".join(str(d) if isinstance(d, int) else "?" for d in shape) + "]"


def resolve_shapes(specs: Sequence[TensorSpec], given: Mapping[str, tuple[int, ...]], batch: int = 1,
                   alternative: str = "") -> dict[str, tuple[int, ...]]:
    """A concrete shape per input: the given one (checked), else the signature with ``batch`` for a dynamic first dim.

    A dynamic dimension after the first without a given shape is refused, naming the flag to use
    (and ``alternative``, another way to give it, e.g. ``--golden DIR``)."""
    names = {s.name for s in specs}
    unknown = sorted(set(given) - names)
    if unknown:
        raise UserError(f"{SHAPE_FLAG} names {listing(unknown)}: the model's inputs are {listing(sorted(names))}")
    shapes = {}
    for spec in specs:
        if spec.name in given:
            shapes[spec.name] = _checked(spec, given[spec.name])
            continue
        if any(not isinstance(d, int) for d in spec.shape[1:]):
            example = "x".join(str(d) if isinstance(d, int) else "1" if i == 0 else d or "N" for i, d in enumerate(spec.shape))
            also = f" or {alternative}" if alternative else ""
            raise UserError(f"input {spec.name!r} has dynamic dims {_describe(spec.shape)}: give "
                            f"{SHAPE_FLAG} {spec.name}={example}{also}")
        shapes[spec.name] = concrete_shape(spec.shape, batch)
    return shapes


def _checked(spec: TensorSpec, shape: tuple[int, ...]) -> tuple[int, ...]:
    fixed_ok = all(not isinstance(w, int) or w == g for w, g in zip(spec.shape, shape, strict=False))
    if len(shape) != len(spec.shape) or not fixed_ok:
        got = "x".join(map(str, shape))
        raise UserError(f"{SHAPE_FLAG} {spec.name}={got} does not fit the input's shape {_describe(spec.shape)}")
    return shape


def concrete_shape(shape: Sequence[object], batch: int = 1) -> tuple[int, ...]:
    """``shape`` with ``batch`` for a dynamic first dim and 1 for any other dynamic dim."""
    return tuple(d if isinstance(d, int) and d > 0 else (batch if i == 0 else 1) for i, d in enumerate(shape))


def synthetic_feeds(specs: Sequence[TensorSpec], shapes: Mapping[str, tuple[int, ...]],
                    seed: int = 20261121) -> dict[str, np.ndarray]:
    """Reproducible tensors in ``shapes`` from the one generator, ``edgecore.tensors.synthetic_feeds`` (strings as ``U``)."""
    return tensors.synthetic_feeds(specs, seed, shapes=shapes)


def model_inputs(path: Path) -> list[TensorSpec]:
    """The inputs of the model file at ``path`` (checked as the device checks, weights never loaded)."""
    from edgecore.modelcheck import check_model_file

    view = check_model_file(path, check_external_data=False)
    inits = {init.name for init in view.initializers}
    return [TensorSpec(v.name, _dtype(v.elem_type), list(v.dims)) for v in view.inputs if v.name not in inits]
