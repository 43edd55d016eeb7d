"""Tensors the agent makes up and compares: synthetic inputs, and the one output-comparison policy.

Synthetic inputs feed a model that has no golden data: backend selection, the health check,
shadow runs, ``edge-agent probe --input-shape`` and ``edgectl build``'s golden inputs all draw them
here (``edgecore.feeds`` only adds the shapes a user gives), so a model meets the same kind of inputs
everywhere. Values are deterministic per seed: floats in [0, 1) (image-like and safe for log or
sqrt), integers in [0, 10) (small enough for most index inputs), random booleans, and one-letter
strings ``"a"`` to ``"j"`` as a numpy ``U`` array (onnxruntime takes it for ``tensor(string)``, and
``.npz`` stores it without pickle); a dimension that is symbolic or unknown becomes 1 unless
``shapes`` gives the input's shape.

Outputs are compared by the *model's* precision (fp32, fp16, int8: ``model_precision``): a float
output may be off by a share of its own range (largest magnitude of the reference), an integer
output (labels) may differ on a share of its elements; a string output must match exactly
(runtimes hand strings back as ``object`` arrays, golden data keeps them as ``U`` arrays: both
are compared as text). Backend selection, staging's golden check and shadow runs use this one
policy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgecore.backends.base import TensorSpec
from edgecore.errors import ModelError

__all__ = [
    "TOLERANCES",
    "OutputCheck",
    "Tolerance",
    "agreeing_rows",
    "compare_outputs",
    "model_precision",
    "synthetic_feeds",
]


@dataclass(frozen=True)
class Tolerance:
    """How far outputs of one model precision may drift."""

    relative: float  # largest |got - want| over the reference's largest magnitude
    int_mismatch: float  # largest share of differing elements in an integer output


TOLERANCES = {
    "fp32": Tolerance(1e-3, 0.0),
    "fp16": Tolerance(2e-2, 0.01),
    "int8": Tolerance(6e-2, 0.02),
}
_QUANTIZED_OPS = {"QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul", "MatMulInteger", "ConvInteger"}


def synthetic_feeds(
    specs: Sequence[TensorSpec],
    rng: np.random.Generator | int = 0,
    like: Mapping[str, np.ndarray] | None = None,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
) -> dict[str, np.ndarray]:
    """One deterministic input per spec, in ``shapes`` where given; with ``like`` (golden feeds), its shapes and dtypes."""
    rng = np.random.default_rng(rng) if isinstance(rng, int) else rng
    if like:
        template = {name: (tuple(value.shape), value.dtype) for name, value in like.items()}
    else:
        given = shapes or {}
        template = {spec.name: (tuple(given.get(spec.name) or _shape(spec)), _dtype(spec.dtype)) for spec in specs}
    return {name: _draw(rng, shape, dtype) for name, (shape, dtype) in template.items()}


@dataclass(frozen=True)
class OutputCheck:
    """The worst relative error over float outputs, and why the outputs fail (None: they pass)."""

    max_rel_error: float
    problem: str | None


def compare_outputs(got: Mapping[str, Any], want: Mapping[str, Any], precision: str) -> OutputCheck:
    """Check every expected output against ``got`` within the tolerance of ``precision``."""
    tolerance = _tolerance(precision)
    worst = 0.0
    for name, ref in want.items():
        if name not in got:
            return OutputCheck(worst, f"output '{name}' is missing")
        value = got[name]
        if not isinstance(ref, np.ndarray) or not isinstance(value, np.ndarray):
            continue  # non-tensor outputs (ONNX-ML maps) only run on onnxruntime: nothing to compare
        if value.shape != ref.shape:
            return OutputCheck(worst, f"output '{name}' has shape {list(value.shape)}, expected {list(ref.shape)}")
        if _is_text(ref) or _is_text(value):
            share = _text_mismatch(value, ref)
            if share:
                return OutputCheck(worst, f"output '{name}' differs on {share:.1%} of its strings")
            continue
        if ref.dtype.kind in "iub":
            share = float(np.mean(value != ref)) if ref.size else 0.0
            if share > tolerance.int_mismatch:
                return OutputCheck(worst, f"output '{name}' differs on {share:.1%} of elements")
            continue
        if ref.dtype.kind != "f":
            continue
        rel = _relative_error(value, ref)
        worst = max(worst, rel)
        if rel > tolerance.relative or np.isnan(value).sum() != np.isnan(ref).sum():
            return OutputCheck(worst, f"output '{name}' is off by {rel:.2e} of its range "
                                      f"(tolerance {tolerance.relative:g} for {precision})")
    return OutputCheck(worst, None)


def agreeing_rows(a: np.ndarray, b: np.ndarray, precision: str) -> np.ndarray:
    """Per sample (first axis; one sample for scalars), whether two same-shaped outputs agree.

    A classifier-like output (float, last axis > 1) agrees on the same top-1 class; another float
    output within ``precision``'s share of ``a``'s range; anything else (labels, strings) on equal
    values.
    """
    rows = a.shape[0] if a.ndim > 1 else 1
    a2, b2 = a.reshape(rows, -1), b.reshape(rows, -1)
    if a.dtype.kind == "f" and a.ndim >= 2 and a.shape[-1] > 1:
        top = a.reshape(-1, a.shape[-1]).argmax(-1) == b.reshape(-1, b.shape[-1]).argmax(-1)
        return np.asarray(top.reshape(rows, -1).all(axis=1))
    if a.dtype.kind in "fc":
        scale = max(float(np.nanmax(np.abs(a))) if a.size and not np.isnan(a).all() else 0.0, 1e-6)
        diff = np.abs(a2.astype(np.float64) - b2.astype(np.float64)) if a.dtype.kind == "f" else np.abs(a2 - b2)
        close = (diff <= _tolerance(precision).relative * scale) | (np.isnan(a2) & np.isnan(b2))
        return np.asarray(close.all(axis=1))
    return np.asarray((a2 == b2).all(axis=1))


def model_precision(model_path: Path) -> str:
    """``int8`` for quantized graphs, ``fp16`` for half-precision weights, else ``fp32`` (read without onnx)."""
    from edgecore.modelwire import FLOAT16, parse_model

    try:
        data = Path(model_path).read_bytes()
    except OSError as exc:
        raise ModelError(f"{Path(model_path).name}: not a readable ONNX model: {exc}") from exc
    view = parse_model(data, Path(model_path).name)
    if any(node.op_type in _QUANTIZED_OPS for node in view.top_nodes):
        return "int8"
    if any(init.data_type == FLOAT16 for init in view.initializers):
        return "fp16"
    return "fp32"


def _tolerance(precision: str) -> Tolerance:
    try:
        return TOLERANCES[precision]
    except KeyError:
        raise ModelError(f"unknown model precision {precision!r} (known: {', '.join(TOLERANCES)})") from None


def _relative_error(value: np.ndarray, ref: np.ndarray) -> float:
    if not ref.size:
        return 0.0
    scale = float(np.max(np.abs(ref)))
    diff = np.abs(value.astype(np.float64) - ref.astype(np.float64))
    return float(np.nanmax(diff)) / max(scale, 1e-6)


def _is_text(value: np.ndarray) -> bool:
    return value.dtype.kind in "US" or (value.dtype.kind == "O" and any(isinstance(v, str | bytes) for v in value.flat))


def _as_text(value: np.ndarray) -> np.ndarray:
    """Elements as ``str`` in an object array (bytes decoded as UTF-8, undecodable bytes kept distinct)."""
    texts = [v.decode("utf-8", "surrogateescape") if isinstance(v, bytes) else str(v) for v in value.flat]
    return np.array(texts, dtype=object).reshape(value.shape)


def _text_mismatch(value: np.ndarray, ref: np.ndarray) -> float:
    """Share of elements whose text differs (1.0 when one side is not text at all)."""
    if not (_is_text(value) and _is_text(ref)):
        return 1.0
    return float(np.mean(_as_text(value) != _as_text(ref))) if ref.size else 0.0


def _shape(spec: TensorSpec) -> tuple[int, ...]:
    return tuple(d if isinstance(d, int) and d >= 0 else 1 for d in spec.shape)


def _dtype(name: str) -> np.dtype[Any]:
    try:
        return np.dtype(name)
    except TypeError:
        return np.dtype("float32")


def _draw(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
    if dtype.kind in "fc":
        return rng.random(shape).astype(dtype)
    if dtype.kind in "iu":
        return rng.integers(0, 10, size=shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    if dtype.kind in "OUS":  # strings: U, which onnxruntime takes (not S) and .npz keeps without pickle
        letters = np.array(list("abcdefghij"))
        return np.asarray(letters[rng.integers(0, len(letters), size=shape)])
    raise ModelError(f"cannot synthesize inputs of dtype {dtype}")
