"""One accuracy metric per model output, chosen from what the output is (or from `--metric`).

Agreement metrics, in points (0..100, the share that agrees with the user's model):

- ``top1`` / ``top5``: class scores ``[N, C]``, only with evidence that they are class scores (a
  Softmax/LogSoftmax producer, rows that are probabilities, a class-like output name, or labels);
- ``pixel-top1``: segmentation logits ``[N, C, H, W]`` / ``[N, H, W, C]``, per-pixel arg-max agreement;
- ``detection``: a boxes ``[N, A, 4]`` and scores ``[N, A, C]`` pair, agreement on the *confident*
  predictions only (quantize.detection), never on every background anchor;
- ``exact``: integer or boolean outputs.

Signal metrics, in dB:

- ``sqnr``: regressions, embeddings, landmarks, ``[N, 1]`` heads and anything unrecognised; the report
  adds the largest per-sample relative error and its sample;
- ``psnr``: image outputs (same channels and size, or a multiple, as an image input).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from edgecore.errors import UserError
from quantize.detection import CONFIDENCE, Pair, find_pairs, pair_problem

__all__ = ["DB_METRICS", "METRICS", "OutputMetric", "choose_metrics", "parse_metric_option"]

METRICS = ("top1", "top5", "pixel-top1", "detection", "sqnr", "psnr", "exact")
DB_METRICS = ("sqnr", "psnr")
_TITLES = {"top1": "top-1 agreement", "top5": "top-5 agreement", "pixel-top1": "per-pixel class agreement",
           "detection": "confident-detection agreement", "sqnr": "SQNR", "psnr": "PSNR", "exact": "exact agreement"}
_MAX_SEG_CLASSES = 256  # more channels than this is a feature map, not a class axis
_CLASS_WORDS = re.compile(r"logit|prob|class|cls|label|softmax|categor", re.IGNORECASE)
_REGRESSION_WORDS = re.compile(r"box|landmark|lmk|point|kpt|keypoint|coord|pose|reg|embed|feat|vec|depth|offset",
                               re.IGNORECASE)
_PASS_THROUGH = {"Identity", "Flatten", "Reshape", "Squeeze", "Unsqueeze", "Transpose", "Cast"}
Reference = list[list[np.ndarray]]  # per sample, per output


@dataclass(frozen=True)
class OutputMetric:
    """The metric of one output, why it was chosen, and what it needs (class axis, detection partner)."""

    output: str
    metric: str
    why: str
    axis: int = -1
    partner: str = ""  # detection: the other output of the boxes/scores pair
    role: str = ""  # detection: "boxes" or "scores"

    @property
    def title(self) -> str:
        """The metric as the report names it."""
        return _TITLES[self.metric]

    @property
    def unit(self) -> str:
        """"dB" for signal metrics, "points" for agreement metrics."""
        return "dB" if self.metric in DB_METRICS else "points"


def parse_metric_option(values: Sequence[str]) -> dict[str, str]:
    """`--metric NAME` (every output) or `--metric OUTPUT=NAME` (one output), as {output or "*": metric}."""
    chosen: dict[str, str] = {}
    for value in values:
        output, _, metric = value.rpartition("=")
        if metric not in ("auto", *METRICS):
            raise UserError(f"--metric {value!r}: use one of auto, {', '.join(METRICS)} (or OUTPUT=METRIC)")
        chosen[output or "*"] = metric
    return chosen


def choose_metrics(model: onnx.ModelProto, reference: Reference, asked: dict[str, str]) -> list[OutputMetric]:
    """The metric of each output of `model` (the user's model) from its outputs on every sample, honouring `asked`."""
    names = [o.name for o in model.graph.output]
    unknown = sorted(set(asked) - {"*", *names})
    if unknown:
        raise UserError(f"--metric {unknown[0]}=...: the model has no output {unknown[0]!r} "
                        f"(outputs: {', '.join(names)})")
    per_output = {name: [sample[i] for sample in reference] for i, name in enumerate(names)}
    pairs = find_pairs(names, [per_output[n][0] for n in names])
    graph = _GraphFacts(model)
    result = []
    for name in names:
        wanted = asked.get(name, asked.get("*", "auto"))
        if wanted == "auto":
            result.append(_auto(name, per_output, pairs, graph))
        else:
            result.append(_forced(name, per_output, pairs, wanted))
    return result


class _GraphFacts:
    """What the graph says about an output: its producer op, and the model's image inputs."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.producer = {o: n for n in model.graph.node for o in n.output}
        inits = {t.name for t in model.graph.initializer}
        self.images = [_dims(i) for i in model.graph.input if i.name not in inits and len(_dims(i)) == 4]

    def source_op(self, name: str) -> str:
        """The op that computes `name`, looking through reshapes, transposes and casts."""
        node = self.producer.get(name)
        while node is not None and node.op_type in _PASS_THROUGH and node.input:
            node = self.producer.get(node.input[0])
        return node.op_type if node is not None else ""


def _dims(info: onnx.ValueInfoProto) -> list[int]:
    return [d.dim_value if d.HasField("dim_value") else 0 for d in info.type.tensor_type.shape.dim]


def _auto(name: str, outputs: dict[str, list[np.ndarray]], pairs: list[Pair], graph: _GraphFacts) -> OutputMetric:
    arrays = outputs[name]
    first = arrays[0]
    if not np.issubdtype(first.dtype, np.floating):
        return OutputMetric(name, "exact", "integer or boolean output")
    pair = next((p for p in pairs if name in (p.boxes, p.scores)), None)
    if pair is not None:
        problem = pair_problem(outputs[pair.boxes], outputs[pair.scores])
        if problem is None:
            return _detection(name, pair, f"detector output pair boxes={pair.boxes}, scores={pair.scores}: "
                                          f"agreement on predictions with score >= {CONFIDENCE}")
        return OutputMetric(name, "sqnr", f"detector pair {pair.boxes}/{pair.scores} but {problem}: SQNR")
    per_sample = first.size // max(first.shape[0], 1) if first.ndim else 1
    if per_sample <= 1:
        return OutputMetric(name, "sqnr", "one value per sample: SQNR over the samples (never a per-sample cosine)")
    if first.ndim == 2:
        evidence = _class_evidence(name, arrays, graph)
        if evidence:
            return OutputMetric(name, "top1", f"[N, C] class scores ({evidence})")
        return OutputMetric(name, "sqnr", f"[N, {first.shape[1]}] without class-score evidence (no Softmax, "
                                          f"name, or probabilities): regression; --metric {name}=top1 if it is one")
    if first.ndim == 4:
        return _spatial(name, outputs, graph)
    return OutputMetric(name, "sqnr", "regression, embedding or feature output")


def _detection(name: str, pair: Pair, why: str) -> OutputMetric:
    boxes = name == pair.boxes
    return OutputMetric(name, "detection", why, partner=pair.scores if boxes else pair.boxes,
                        role="boxes" if boxes else "scores")


def _class_evidence(name: str, arrays: list[np.ndarray], graph: _GraphFacts) -> str:
    op = graph.source_op(name)
    if op in ("Softmax", "LogSoftmax"):
        return f"computed by {op}"
    if _probabilities(arrays, -1):
        return "rows are probabilities"
    if _CLASS_WORDS.search(name) and not _REGRESSION_WORDS.search(name):
        return f"named {name!r}"
    return ""


def _probabilities(arrays: list[np.ndarray], axis: int) -> bool:
    return all(a.min() >= 0 and np.allclose(a.sum(axis=axis), 1.0, atol=1e-3) for a in arrays)


def _spatial(name: str, outputs: dict[str, list[np.ndarray]], graph: _GraphFacts) -> OutputMetric:
    arrays = outputs[name]
    shape = arrays[0].shape
    axis = _class_axis(shape)
    op = graph.source_op(name)
    if axis is not None and (op in ("Softmax", "LogSoftmax") or _probabilities(arrays, axis)):
        return OutputMetric(name, "pixel-top1", f"segmentation map: class scores on axis {axis}", axis)
    image = _image_like(shape, graph.images)
    if image:
        return OutputMetric(name, "psnr", f"image output ({image})")
    maps = [n for n, a in outputs.items() if a[0].ndim == 4 and np.issubdtype(a[0].dtype, np.floating)]
    if axis is not None and maps == [name]:
        return OutputMetric(name, "pixel-top1", f"the model's one spatial map, {shape[axis]} channels on axis {axis}: "
                                                "segmentation logits", axis)
    return OutputMetric(name, "sqnr", "feature map or heat map")


def _image_like(shape: tuple[int, ...], images: list[list[int]]) -> str:
    """Why `shape` is an image (NCHW or NHWC, 1/3/4 channels, an input's size or a multiple), else ""."""
    for layout, (c, h, w) in (("NCHW", shape[1:]), ("NHWC", (shape[3], shape[1], shape[2]))):
        if c not in (1, 3, 4):
            continue
        for dims in images:
            ic, ih, iw = (dims[1], dims[2], dims[3]) if dims[1] in (1, 3, 4) else (dims[3], dims[1], dims[2])
            if ic == c and ih and iw and h % ih == 0 and w % iw == 0 and h // ih == w // iw:
                scale = "same size" if h == ih else f"x{h // ih}"
                return f"{layout}, {c} channels like the image input, {scale}"
    return ""


def _class_axis(shape: tuple[int, ...]) -> int | None:
    """Axis 1 (NCHW) or 3 (NHWC) of a [N, C, H, W] map with a plausible class count, else None."""
    candidates = [(shape[a], a) for a in (1, 3) if 2 <= shape[a] <= _MAX_SEG_CLASSES]
    if not candidates:
        return None
    classes, axis = min(candidates)
    spatial = [d for i, d in enumerate(shape[1:], 1) if i != axis]
    return axis if all(d > 1 for d in spatial) and classes < max(spatial) else None


def _forced(name: str, outputs: dict[str, list[np.ndarray]], pairs: list[Pair], wanted: str) -> OutputMetric:
    first = outputs[name][0]
    shape = list(first.shape)
    if wanted in ("top1", "top5"):
        if first.ndim < 2 or first.shape[-1] < (5 if wanted == "top5" else 2):
            raise UserError(f"--metric {name}={wanted}: output {name!r} has shape {shape}, no class axis for {wanted}")
        return OutputMetric(name, wanted, "--metric")
    if wanted == "pixel-top1":
        axis = _class_axis(first.shape) if first.ndim == 4 else None
        if axis is None:
            raise UserError(f"--metric {name}=pixel-top1: output {name!r} has shape {shape}, "
                            "not a [N,C,H,W] or [N,H,W,C] map")
        return OutputMetric(name, "pixel-top1", "--metric", axis)
    if wanted == "detection":
        pair = next((p for p in pairs if name in (p.boxes, p.scores)), None)
        if pair is None:
            raise UserError(f"--metric {name}=detection: output {name!r} ({shape}) is not part of a boxes [N,A,4] "
                            "/ scores [N,A,C] output pair")
        problem = pair_problem(outputs[pair.boxes], outputs[pair.scores])
        if problem is not None:
            raise UserError(f"--metric {name}=detection: {problem}")
        return _detection(name, pair, "--metric")
    if wanted == "exact" or np.issubdtype(first.dtype, np.floating):
        return OutputMetric(name, wanted, "--metric")
    raise UserError(f"--metric {name}={wanted}: output {name!r} is {first.dtype}, not float: use exact")
