"""Golden data in a package: ``golden.npz`` with ``input:<name>`` and ``output:<name>`` arrays."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["compare_outputs", "load_golden", "tolerance_for"]


def load_golden(path: Path) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(inputs, expected outputs) from a golden npz; pickled objects are refused."""
    with np.load(path, allow_pickle=False) as data:
        inputs = {k[len("input:"):]: data[k] for k in data.files if k.startswith("input:")}
        outputs = {k[len("output:"):]: data[k] for k in data.files if k.startswith("output:")}
    return inputs, outputs


def tolerance_for(dtype: Any) -> tuple[float, float]:
    """(rtol, atol) by precision: fp16 and quantized models drift more than fp32."""
    if np.dtype(dtype) == np.float16:
        return 1e-2, 1e-2
    return 1e-3, 1e-4


def compare_outputs(got: dict[str, Any], expected: dict[str, np.ndarray], np_mod: Any = np) -> str | None:
    """None when every expected output matches; else a one-line description of the first mismatch."""
    for name, want in expected.items():
        if name not in got:
            return f"output {name!r} missing"
        have = np_mod.asarray(got[name])
        if have.shape != want.shape:
            return f"output {name!r}: shape {list(have.shape)} != {list(want.shape)}"
        if want.dtype.kind in "fc":
            rtol, atol = tolerance_for(want.dtype)
            if not np_mod.allclose(have, want, rtol=rtol, atol=atol, equal_nan=False):
                diff = float(np_mod.max(np_mod.abs(have.astype(np_mod.float64) - want)))
                return f"output {name!r}: max abs difference {diff:.3g}"
        elif not np_mod.array_equal(have, want):
            return f"output {name!r}: values differ"
    return None
