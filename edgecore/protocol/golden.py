"""Golden data in a package: ``golden.npz`` with ``input:<name>`` and ``output:<name>`` arrays."""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["load_golden"]


def load_golden(path: Path) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(inputs, expected outputs) from a golden npz; pickled objects are refused."""
    with np.load(path, allow_pickle=False) as data:
        inputs = {k[len("input:"):]: data[k] for k in data.files if k.startswith("input:")}
        outputs = {k[len("output:"):]: data[k] for k in data.files if k.startswith("output:")}
    return inputs, outputs
