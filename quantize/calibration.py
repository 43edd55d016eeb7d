"""onnxruntime CalibrationDataReader over a SampleSet, with a progress bar."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod
from rich.progress import Progress, TaskID

from edgecore.errors import UserError
from quantize.samples import SampleSet

__all__ = ["METHODS", "StreamingReader", "method_named", "stride_for"]

_MAX_STRIDE = 16  # samples whose activations are held before MinMax merges their ranges

METHODS = {
    "minmax": CalibrationMethod.MinMax,
    "entropy": CalibrationMethod.Entropy,
    "percentile": CalibrationMethod.Percentile,
}


def method_named(name: str) -> CalibrationMethod:
    """The onnxruntime calibration method for a CLI name."""
    try:
        return METHODS[name]
    except KeyError:
        raise UserError(f"unknown calibration method {name!r} (known: {', '.join(METHODS)})") from None


def stride_for(count: int) -> int:
    """The largest window <= 16 that divides `count` (onnxruntime needs an exact division)."""
    return max(d for d in range(1, min(_MAX_STRIDE, count) + 1) if count % d == 0)


class StreamingReader(CalibrationDataReader):  # type: ignore[misc]
    """Hands samples to onnxruntime one at a time; ticks a progress bar when one is given."""

    def __init__(self, samples: SampleSet, progress: Progress | None = None, label: str = "calibrating") -> None:
        self.samples = samples
        self.progress = progress
        self.label = label
        self._iter: Iterator[dict[str, np.ndarray]] | None = None
        self._task: TaskID | None = None
        self._left: int | None = None  # samples left in the current window (strided calibration)

    def set_range(self, start_index: int, end_index: int) -> None:
        """Serve the next window of samples; onnxruntime asks for consecutive windows in order."""
        self._left = end_index - start_index

    def get_next(self) -> dict[str, np.ndarray] | None:
        """The next sample, or None when the stream is exhausted."""
        if self._iter is None:
            self._iter = iter(self.samples)
            if self.progress is not None:
                self._task = self.progress.add_task(self.label, total=len(self.samples))
        if self._left is not None:
            if self._left == 0:
                return None
            self._left -= 1
        sample = next(self._iter, None)
        if sample is not None and self.progress is not None and self._task is not None:
            self.progress.advance(self._task)
        return sample

    def rewind(self) -> None:
        """Start over from the first sample (onnxruntime's qdq_loss_debug iterates twice)."""
        self._iter = None

    def __len__(self) -> int:
        return len(self.samples)
