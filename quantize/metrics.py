"""One accuracy metric per model output, chosen from what the output is (or from `--metric`).

- ``top1``: classifier logits ``[N, C]``: share of rows whose arg-max over the class axis agrees.
- ``pixel-top1``: a segmentation map ``[N, C, H, W]`` or ``[N, H, W, C]``: share of pixels whose
  arg-max over the class axis agrees.
- ``cosine``: everything else (regressions, detector heads, embeddings): mean cosine similarity x100.
- ``relative-error``: ``100 * (1 - ||ref - got|| / ||ref||)``, for outputs where scale matters.
- ``exact``: integer or boolean outputs (arg-max maps, counts): share of equal elements.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from agent.errors import UserError

__all__ = ["METRICS", "OutputMetric", "choose_metrics", "parse_metric_option", "score_output"]

METRICS = ("top1", "pixel-top1", "cosine", "relative-error", "exact")
_TITLES = {"top1": "top-1 agreement", "pixel-top1": "per-pixel top-1 agreement", "cosine": "cosine similarity",
           "relative-error": "relative error", "exact": "exact agreement"}
_MAX_SEG_CLASSES = 256  # more channels than this is a feature map or detector head, not a class axis


@dataclass(frozen=True)
class OutputMetric:
    """The metric of one output and, for top-1 metrics, its class axis."""

    output: str
    metric: str
    axis: int = -1
    why: str = ""

    @property
    def title(self) -> str:
        """The metric as the report names it."""
        return _TITLES[self.metric]


def parse_metric_option(values: Sequence[str]) -> dict[str, str]:
    """`--metric NAME` (every output) or `--metric OUTPUT=NAME` (one output), as {output or "*": metric}."""
    chosen: dict[str, str] = {}
    for value in values:
        output, _, metric = value.rpartition("=")
        if metric not in ("auto", *METRICS):
            raise UserError(f"--metric {value!r}: use one of auto, {', '.join(METRICS)} (or OUTPUT=METRIC)")
        chosen[output or "*"] = metric
    return chosen


def choose_metrics(names: list[str], first: list[np.ndarray], asked: dict[str, str]) -> list[OutputMetric]:
    """The metric of each output from the float model's outputs on one sample, honouring `asked`."""
    unknown = sorted(set(asked) - {"*", *names})
    if unknown:
        raise UserError(f"--metric {unknown[0]}=...: the model has no output {unknown[0]!r} "
                        f"(outputs: {', '.join(names)})")
    floats = [a for a in first if np.issubdtype(a.dtype, np.floating)]
    single_map = len(floats) == 1
    result = []
    for name, array in zip(names, first, strict=True):
        wanted = asked.get(name, asked.get("*", "auto"))
        auto = _auto(name, array, single_map)
        if wanted in ("auto", auto.metric):
            result.append(auto)
        else:
            result.append(_forced(name, array, wanted))
    return result


def score_output(metric: OutputMetric, reference: list[np.ndarray], outputs: list[np.ndarray]) -> float:
    """Points (0..100, higher is better) of `outputs` against `reference`, over every sample."""
    if metric.metric in ("top1", "pixel-top1"):
        same = [np.argmax(r, metric.axis) == np.argmax(o, metric.axis) for r, o in zip(reference, outputs, strict=True)]
        return _points(float(np.mean(np.concatenate([s.ravel() for s in same]))))
    if metric.metric == "exact":
        return _points(float(np.mean(np.concatenate([(r == o).ravel() for r, o in zip(reference, outputs, strict=True)]))))
    pairs = [(r.astype(np.float64).ravel(), o.astype(np.float64).ravel()) for r, o in zip(reference, outputs, strict=True)]
    if metric.metric == "relative-error":
        noise = np.sqrt(sum(float((r - o) @ (r - o)) for r, o in pairs))
        signal = np.sqrt(sum(float(r @ r) for r, _ in pairs))
        return _points(max(0.0, 1.0 - noise / signal) if signal > 0 else float(noise == 0))
    return _points(float(np.mean([cosine(r, o) for r, o in pairs])))


def cosine(r: np.ndarray, g: np.ndarray) -> float:
    """Cosine similarity of two flat vectors; two zero vectors agree, one zero vector does not."""
    denom = float(np.linalg.norm(r) * np.linalg.norm(g))
    if denom == 0:
        return 1.0 if not r.any() and not g.any() else 0.0
    return float(r @ g) / denom


def _points(share: float) -> float:
    return round(100.0 * float(share), 6)


def _auto(name: str, array: np.ndarray, single_map: bool) -> OutputMetric:
    if not np.issubdtype(array.dtype, np.floating):
        return OutputMetric(name, "exact", why="integer output")
    if array.ndim == 2 and array.shape[0] <= 64 and array.shape[1] > 1:
        return OutputMetric(name, "top1", -1, "[N, C] classifier output")
    axis = _class_axis(array)
    if single_map and axis is not None:
        return OutputMetric(name, "pixel-top1", axis, "the model's one spatial map: segmentation")
    return OutputMetric(name, "cosine", why="regression or detector head")


def _class_axis(array: np.ndarray) -> int | None:
    """Axis 1 (NCHW) or 3 (NHWC) of a [N, C, H, W] map with a plausible class count, else None."""
    if array.ndim != 4:
        return None
    candidates = [(array.shape[a], a) for a in (1, 3) if 2 <= array.shape[a] <= _MAX_SEG_CLASSES]
    if not candidates:
        return None
    classes, axis = min(candidates)
    spatial = [d for i, d in enumerate(array.shape[1:], 1) if i != axis]
    return axis if all(d > 1 for d in spatial) and classes < max(spatial) else None


def _forced(name: str, array: np.ndarray, wanted: str) -> OutputMetric:
    if wanted == "top1":
        if array.ndim < 2 or array.shape[-1] < 2:
            raise UserError(f"--metric {name}=top1: output {name!r} has shape {list(array.shape)}, no class axis")
        return OutputMetric(name, "top1", -1, "--metric")
    if wanted == "pixel-top1":
        axis = _class_axis(array)
        if axis is None:
            raise UserError(f"--metric {name}=pixel-top1: output {name!r} has shape {list(array.shape)}, "
                            "not a [N,C,H,W] or [N,H,W,C] map")
        return OutputMetric(name, "pixel-top1", axis, "--metric")
    return OutputMetric(name, wanted, why="--metric")
