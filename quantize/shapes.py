"""Static input shapes for models exported with dynamic ones: from `--static-shape` or the first `--calib` sample.

Calibration, evaluation and target analysis need concrete shapes (onnxruntime's pre-processing and
calibration fail on `[-1,3,-1,-1]` inputs). The output model keeps the shape it was quantized at:
onnxruntime's pre-processing folds shape computations into constants, so a variant made at one
shape is not safe to relabel as dynamic.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import onnx

from edgecore.errors import UserError
from quantize.samples import InputSpec, input_specs

__all__ = ["dynamic_inputs", "fix_input_shapes", "parse_static_shapes", "unloadable_with_branches"]

_SHAPE = re.compile(r"^([^=]+)=(\d+(?:x\d+)*)$")


def parse_static_shapes(values: Sequence[str]) -> dict[str, list[int]]:
    """`NAME=1x3x224x224` strings as {name: dims}; a one-line UserError for anything else."""
    shapes: dict[str, list[int]] = {}
    for value in values:
        match = _SHAPE.match(value.strip())
        dims = [int(d) for d in match.group(2).split("x")] if match else []
        if match is None or not all(dims):
            raise UserError(f"--static-shape {value!r}: use NAME=1x3x224x224 (positive integers)")
        shapes[match.group(1)] = dims
    return shapes


def dynamic_inputs(model: onnx.ModelProto) -> list[InputSpec]:
    """The inputs with at least one dynamic dim (dim_param, missing, or <= 0)."""
    return [s for s in input_specs(model) if any(d is None for d in s.shape)]


def fix_input_shapes(model: onnx.ModelProto, shapes: dict[str, list[int]], source: str) -> tuple[onnx.ModelProto, str]:
    """A copy with `shapes` as the inputs' static dims, shapes re-inferred; and a note saying so."""
    specs = {s.name: s for s in input_specs(model)}
    for name, dims in shapes.items():
        spec = specs.get(name)
        if spec is None:
            raise UserError(f"--static-shape {name}=...: the model has no input {name!r} "
                            f"(inputs: {', '.join(specs) or 'none'})")
        _check_fits(spec, dims, source)
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    for value in fixed.graph.input:
        if value.name in shapes:
            _set_dims(value, shapes[value.name])
    for value in fixed.graph.output:  # -1 dims break shape inference's merge; let it re-infer them
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_value") and dim.dim_value <= 0:
                dim.Clear()
    del fixed.graph.value_info[:]
    try:
        fixed = onnx.shape_inference.infer_shapes(fixed)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as exc:
        raise UserError(f"static shapes {_show(shapes)} ({source}) do not fit the model: "
                        f"{str(exc).splitlines()[0][:200]}") from exc
    return fixed, f"inputs fixed to {_show(shapes)} ({source}); the output model takes these shapes"


def unloadable_with_branches(model: onnx.ModelProto) -> str | None:
    """Why onnxruntime refuses a model with If/Loop/Scan nodes (None when it loads, or has none).

    onnxruntime infers every branch against the fixed input shapes, the branch a sample never takes
    included, and a model exported for dynamic shapes can fail that.
    """
    if not any(a.HasField("g") or len(a.graphs) for n in model.graph.node for a in n.attribute):
        return None
    import onnxruntime as ort

    try:
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph types
        return str(exc).splitlines()[0][:200]
    return None


def _check_fits(spec: InputSpec, dims: list[int], source: str) -> None:
    shown = "x".join(map(str, dims))
    if len(dims) != len(spec.shape):
        raise UserError(f"{source} {spec.name}={shown}: input {spec.name!r} has rank {len(spec.shape)} "
                        f"{spec.describe()}")
    for axis, (want, got) in enumerate(zip(spec.shape, dims, strict=True)):
        if want is not None and want != got:
            raise UserError(f"{source} {spec.name}={shown}: input {spec.name!r} is {spec.describe()}, "
                            f"dim {axis} is fixed at {want}")


def _set_dims(value: onnx.ValueInfoProto, dims: list[int]) -> None:
    shape = value.type.tensor_type.shape
    del shape.dim[:]
    for d in dims:
        shape.dim.add().dim_value = d


def _show(shapes: dict[str, list[int]]) -> str:
    return ", ".join(f"{n}={'x'.join(map(str, d))}" for n, d in shapes.items())
