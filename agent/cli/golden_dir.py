"""Real inputs for ``edge-agent probe --golden DIR``: a folder of samples, read without pickle.

One file per sample, sorted by name: ``.npy`` holds the one input of a single-input model; ``.npz``
holds one array per input, named after it. A package's ``golden.npz`` works as it is: its
``input:NAME`` arrays are the inputs and its ``output:NAME`` arrays the outputs every backend must
reproduce (without them, the reference device's outputs on the same inputs are the reference).
Several samples are stacked on the batch axis, as ``edgectl build --golden`` stacks them; text
stored as bytes is decoded as UTF-8, as the runtimes read it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgecore.backends import TensorSpec
from edgecore.errors import UserError, listing

__all__ = ["read_golden_dir"]

Arrays = dict[str, np.ndarray]


def read_golden_dir(folder: Path, specs: list[TensorSpec]) -> tuple[Arrays, Arrays | None]:
    """(inputs, expected outputs or None) from the samples in ``folder`` for a model with inputs ``specs``."""
    files = sorted(p for p in folder.iterdir() if p.suffix in (".npy", ".npz"))
    if not files:
        raise UserError(f"--golden {folder}: no .npy or .npz samples in it")
    samples = [_sample(path, specs) for path in files]
    inputs = _stack([s for s, _ in samples], specs, folder)
    outputs = [o for _, o in samples]
    if not all(outputs) or len({tuple(sorted(o)) for o in outputs}) != 1:
        return inputs, None  # expected outputs only when every sample carries the same ones
    return inputs, {name: np.concatenate([o[name] for o in outputs]) for name in outputs[0]}


def _sample(path: Path, specs: list[TensorSpec]) -> tuple[Arrays, Arrays]:
    names = [s.name for s in specs]
    try:
        if path.suffix == ".npy":
            if len(specs) != 1:
                raise UserError(f"--golden {path}: a .npy sample feeds a single-input model; this one has inputs "
                                f"{listing(names)}: use .npz files with one array per input")
            return {names[0]: _text(np.load(path, allow_pickle=False), path)}, {}
        with np.load(path, allow_pickle=False) as data:
            arrays = {key: data[key] for key in data.files}
    except ValueError as exc:  # pickled objects, a damaged file
        raise UserError(f"--golden {path}: cannot read it without pickle ({exc})") from exc
    inputs = {k.removeprefix("input:"): v for k, v in arrays.items() if not k.startswith("output:")}
    outputs = {k.removeprefix("output:"): v for k, v in arrays.items() if k.startswith("output:")}
    unknown, missing = sorted(set(inputs) - set(names)), sorted(set(names) - set(inputs))
    if unknown or missing:
        raise UserError(f"--golden {path}: arrays must be named after the inputs {listing(names)}"
                        f"{'; unknown ' + ', '.join(unknown) if unknown else ''}"
                        f"{'; missing ' + ', '.join(missing) if missing else ''}")
    return {k: _text(v, path) for k, v in inputs.items()}, outputs


def _text(array: np.ndarray, path: Path) -> np.ndarray:
    if array.dtype.kind != "S":
        return array
    try:
        return np.char.decode(array, "utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"--golden {path}: bytes that are not UTF-8 ({exc.reason}): the runtimes read text as UTF-8") from exc


def _stack(samples: list[Arrays], specs: list[TensorSpec], folder: Path) -> Arrays:
    if len(samples) == 1:
        return samples[0]
    fixed = [s.name for s in specs if s.shape and isinstance(s.shape[0], int)]
    if fixed:
        raise UserError(f"--golden {folder}: input {fixed[0]!r} has a fixed batch: {len(samples)} samples cannot be "
                        "stacked (keep one sample in the folder)")
    try:
        return {s.name: np.concatenate([sample[s.name] for sample in samples]) for s in specs}
    except ValueError as exc:
        raise UserError(f"--golden {folder}: the samples differ in shape and cannot be stacked ({exc})") from exc
