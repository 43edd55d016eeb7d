"""Input samples for calibration and evaluation: files in a folder or synthetic, streamed one by one."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from edgecore.errors import UserError
from edgecore.feeds import graph_inputs
from quantize.preprocess import ImagePreprocess, load_preprocess

__all__ = ["InputSpec", "SampleSet", "cast_to_inputs", "input_specs"]

_ARRAYS = (".npy", ".npz")
_IMAGES = (".jpg", ".jpeg", ".png")


@dataclass(frozen=True)
class InputSpec:
    """A model input: name, numpy dtype, shape with None for dynamic dims."""

    name: str
    dtype: np.dtype
    shape: list[int | None]

    def describe(self) -> str:
        """Shape and dtype as users read them, e.g. [1,3,224,224] float32."""
        dims = ",".join("?" if d is None else str(d) for d in self.shape)
        return f"[{dims}] {self.dtype}"

    def fits(self, array: np.ndarray) -> bool:
        """True when `array` has this input's rank, fixed dims and dtype (a string input: any U or S array)."""
        text = self.dtype.kind == "O" and array.dtype.kind in "US"  # strings stored without pickle
        if (array.dtype != self.dtype and not text) or array.ndim != len(self.shape):
            return False
        return all(d is None or d == a for d, a in zip(self.shape, array.shape, strict=False))


def input_specs(model: onnx.ModelProto) -> list[InputSpec]:
    """The model's real inputs (initializers listed as inputs excluded), every dynamic dim as None."""
    return [InputSpec(s.name, np.dtype(s.dtype), [d if isinstance(d, int) else None for d in s.shape])
            for s in graph_inputs(model)]


def cast_to_inputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`feeds` cast to the model's input dtypes (an fp16-I/O variant takes the float samples)."""
    dtypes = {s.name: s.dtype for s in input_specs(model)}
    return {k: v.astype(dtypes[k]) if k in dtypes and v.dtype != dtypes[k] else v for k, v in feeds.items()}


class SampleSet:
    """A re-iterable stream of validated input dicts; only one sample is in memory at a time."""

    def __init__(self, specs: list[InputSpec], files: list[Path] | None = None, synthetic: int = 0,
                 preprocess: ImagePreprocess | None = None, seed: int = 0) -> None:
        self.specs = specs
        self.files = files or []
        self.synthetic = synthetic
        self.preprocess = preprocess
        self.seed = seed

    @classmethod
    def from_dir(cls, folder: Path, specs: list[InputSpec], preprocess_yaml: Path | None = None,
                 limit: int | None = None) -> SampleSet:
        """Samples from `folder`: one .npy/.npz/.jpg/.png per sample, sorted by name (labels.npy is not one)."""
        if not folder.is_dir():
            raise UserError(f"{folder}: not a folder of calibration samples")
        files = sorted(p for p in folder.iterdir()
                       if p.suffix.lower() in _ARRAYS + _IMAGES and p.name != "labels.npy")
        if not files:
            raise UserError(f"{folder}: no .npy, .npz, .jpg, .jpeg or .png files (empty calibration folder)")
        prep = None
        if any(p.suffix.lower() in _IMAGES for p in files):
            if len(specs) != 1:
                raise UserError(f"{folder}: images can feed only a single-input model; this one has "
                                f"inputs {', '.join(s.name for s in specs)}: use .npz files")
            prep = load_preprocess(preprocess_yaml, specs[0].name)
        return cls(specs, files[:limit] if limit else files, preprocess=prep)

    @classmethod
    def synthetic_set(cls, specs: list[InputSpec], count: int, seed: int = 0) -> SampleSet:
        """`count` random samples shaped like the inputs (batch 1 for dynamic dims)."""
        for spec in specs:
            if any(d is None for d in spec.shape[1:]):
                raise UserError(f"input '{spec.name}' has dynamic dims {spec.describe()}: synthetic samples "
                                "need fixed shapes, give --calib DIR")
        return cls(specs, synthetic=count, seed=seed)

    def __len__(self) -> int:
        return len(self.files) or self.synthetic

    def first_shapes(self) -> dict[str, list[int]]:
        """The shape of every input in the first sample (the shapes a dynamic model is fixed at)."""
        sample = next(iter(self), None)
        return {} if sample is None else {name: list(array.shape) for name, array in sample.items()}

    def with_specs(self, specs: list[InputSpec]) -> SampleSet:
        """The same samples checked against other input specs (after the model's shapes were fixed)."""
        return SampleSet(specs, self.files, self.synthetic, self.preprocess, self.seed)

    def head(self, count: int) -> SampleSet:
        """The first `count` samples as a set of their own."""
        return SampleSet(self.specs, self.files[:count], min(self.synthetic, count), self.preprocess, self.seed)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        if self.synthetic:
            rng = np.random.default_rng(self.seed)
            for _ in range(self.synthetic):
                yield {s.name: _random(rng, s) for s in self.specs}
            return
        for path in self.files:
            yield self._load(path)

    def _load(self, path: Path) -> dict[str, np.ndarray]:
        suffix = path.suffix.lower()
        if suffix in _IMAGES:
            assert self.preprocess is not None
            sample = {self.specs[0].name: self.preprocess.tensor(path, self.specs[0].shape)}
        else:
            sample = _read_arrays(path, self.specs)
        return self._validated(path, sample)

    def _validated(self, path: Path, sample: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        for spec in self.specs:
            array = sample.get(spec.name)
            if array is None:
                have = ", ".join(f"'{k}'" for k in sample) or "nothing"
                raise UserError(f"{path}: no array for input '{spec.name}' (expected {spec.describe()}; "
                                f"file has {have})")
            if array.ndim == len(spec.shape) - 1:
                array = sample[spec.name] = array[None]  # a sample without its batch dimension
            if not spec.fits(array):
                got = ",".join(str(d) for d in array.shape)
                raise UserError(f"{path}: input '{spec.name}' expects {spec.describe()}, got [{got}] {array.dtype}")
        return {spec.name: sample[spec.name] for spec in self.specs}


def _read_arrays(path: Path, specs: list[InputSpec]) -> dict[str, np.ndarray]:
    try:
        if path.suffix.lower() == ".npy":
            if len(specs) != 1:
                raise UserError(f"{path}: a .npy holds one array but the model has inputs "
                                f"{', '.join(s.name for s in specs)}: use .npz with one key per input")
            return {specs[0].name: np.load(path, allow_pickle=False)}
        with np.load(path, allow_pickle=False) as archive:
            return {key: archive[key] for key in archive.files}
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: unreadable array file ({exc})") from exc


def _random(rng: np.random.Generator, spec: InputSpec) -> np.ndarray:
    shape = [1 if d is None else d for d in spec.shape]
    if np.issubdtype(spec.dtype, np.integer):
        return rng.integers(0, 256, size=shape).astype(spec.dtype)
    if spec.dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    return rng.standard_normal(shape).astype(spec.dtype)
