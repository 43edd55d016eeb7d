"""The figure a quantize report gives, recomputed here: the written file and the user's model run on the same samples.

Used by ``./scripts/bench quantize`` and ``./scripts/bench corpus`` (through corpus_quantize.py). Nothing
of quantize's own scoring is used: both models run here (onnxruntime, or OpenVINO's CPU at f32 for an
IR) and each metric is computed here in numpy, from the metric name the report gives per output.
A reported figure agrees when it is within 0.5 points (agreement metrics) or 1 dB (SQNR, PSNR).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

__all__ = ["TOLERANCE", "Check", "recompute"]

TOLERANCE = {"points": 0.5, "dB": 1.0}
Arrays = list[np.ndarray]


@dataclass(frozen=True)
class Check:
    """One output: the figure the report gives and the one computed here."""

    output: str
    metric: str
    unit: str
    reported: float
    computed: float

    @property
    def gap(self) -> float:
        return abs(self.reported - self.computed)

    @property
    def agrees(self) -> bool:
        return self.gap <= TOLERANCE[self.unit]


def recompute(data: dict[str, Any], original: Path, written: onnx.ModelProto | Any,
              samples: list[dict[str, np.ndarray]]) -> list[Check]:
    """The chosen variant's figure per output, recomputed on `samples` (the run's evaluation samples)."""
    names = [m["output"] for m in data["metrics"]]
    ref = dict(zip(names, _run_onnx(onnx.load(str(original)), names, samples), strict=True))
    got = dict(zip(names, _run(written, names, samples), strict=True))
    chosen = next(v for v in data["variants"] if v["name"] == data["chosen"])
    reported = {s["output"]: s for s in chosen["accuracy"]["outputs"]}
    checks = []
    for metric in data["metrics"]:
        score = reported[metric["output"]]
        if score["metric"] == "top-1 accuracy":  # scored on labels: not recomputable without them
            continue
        checks.append(Check(metric["output"], metric["metric"], metric["unit"], score["value"],
                            round(_metric(metric, ref, got), 4)))
    return checks


def _run(model: Any, names: list[str], samples: list[dict[str, np.ndarray]]) -> list[Arrays]:
    if isinstance(model, onnx.ModelProto):
        return _run_onnx(model, names, samples)
    import openvino as ov  # an OpenVINO IR: run as the agent serves it on a CPU (f32)

    core = ov.Core()
    read = core.read_model(model=model.xml.decode(), weights=ov.Tensor(np.frombuffer(model.weights, np.uint8)))
    compiled = core.compile_model(read, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    request = compiled.create_infer_request()
    ports = {n: p for p in compiled.outputs for n in p.get_names()}
    inputs = {n for p in compiled.inputs for n in p.get_names()}
    runs = [request.infer({k: v for k, v in s.items() if k in inputs}) for s in samples]
    return [[np.array(r[ports[n]]) for r in runs] for n in names]


def _run_onnx(model: onnx.ModelProto, names: list[str], samples: list[dict[str, np.ndarray]]) -> list[Arrays]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    types = {i.name: i.type for i in session.get_inputs()}
    cast = {"tensor(float16)": np.float16, "tensor(float)": np.float32}
    runs = [session.run(names, {k: v.astype(cast[types[k]]) if types[k] in cast and v.dtype.kind == "f" else v
                                for k, v in s.items() if k in types}) for s in samples]
    return [[np.asarray(r[i]) for r in runs] for i in range(len(names))]


def _metric(metric: dict[str, Any], ref: dict[str, Arrays], got: dict[str, Arrays]) -> float:
    name, key = metric["output"], metric["key"]
    r, g = ref[name], got[name]
    if key == "sqnr":
        signal = sum(float(np.sum(np.square(a, dtype=np.float64))) for a in r)
        noise = sum(float(np.sum(np.square(a.astype(np.float64) - b))) for a, b in zip(r, g, strict=True))
        return 100.0 if noise == 0 else min(100.0, 10 * math.log10(max(signal, 1e-30) / noise))
    if key == "psnr":
        peak = (max(float(a.max()) for a in r) - min(float(a.min()) for a in r)) or 1.0
        mse = float(np.mean([np.mean(np.square(a.astype(np.float64) - b)) for a, b in zip(r, g, strict=True)]))
        return 100.0 if mse == 0 else min(100.0, 10 * math.log10(peak * peak / mse))
    if key == "exact":
        return 100.0 * float(np.mean(np.concatenate([(a == b).ravel() for a, b in zip(r, g, strict=True)])))
    if key == "top5":
        hits = [np.take(np.argsort(-b, axis=-1), range(5), axis=-1) == np.argmax(a, -1)[..., None]
                for a, b in zip(r, g, strict=True)]
        return 100.0 * float(np.mean(np.concatenate([h.any(-1).ravel() for h in hits])))
    if key in ("top1", "pixel-top1"):
        axis = metric["axis"]
        return 100.0 * float(np.mean(np.concatenate([(np.argmax(a, axis) == np.argmax(b, axis)).ravel()
                                                     for a, b in zip(r, g, strict=True)])))
    boxes, scores = (name, metric["partner"]) if metric["role"] == "boxes" else (metric["partner"], name)
    return _detection(ref[boxes], ref[scores], got[boxes], got[scores])


def _detection(rb: Arrays, rs: Arrays, gb: Arrays, gs: Arrays) -> float:
    """Confident predictions (best foreground score >= 0.5) matched greedily: same class, IoU >= 0.9, score within 0.1."""
    agree = total = 0
    softmax = rs[0].shape[-1] >= 2 and all(np.allclose(s.sum(-1), 1.0, atol=1e-3) for s in rs)  # the user's model's
    corners = _corners([b[0] for b in rb], [s[0] for s in rs], softmax)
    for sample in range(len(rb)):
        ref = _confident(rb[sample][0], rs[sample][0], softmax, corners)
        got = _confident(gb[sample][0], gs[sample][0], softmax, corners)
        total += len(ref[0]) + len(got[0])
        used: set[int] = set()
        for i in np.argsort(-ref[2], kind="stable"):
            best, best_iou = -1, 0.9
            for j in range(len(got[0])):
                if j in used or got[1][j] != ref[1][i]:
                    continue
                iou = _iou(ref[0][i], got[0][j])
                if iou >= best_iou and (best < 0 or iou > best_iou):
                    best, best_iou = j, iou
            if best >= 0:
                used.add(best)
                agree += int(abs(ref[2][i] - got[2][best]) <= 0.1)
    return 100.0 if total == 0 else 200.0 * agree / total


def _corners(boxes: Arrays, scores: Arrays, softmax: bool) -> bool:
    """True when the user's model's confident boxes are (x1, y1, x2, y2), not centre/size."""
    picked = [b[(s[:, 1:] if softmax else s).max(-1) >= 0.5] for b, s in zip(boxes, scores, strict=True)]
    chosen = np.concatenate(picked) if picked else np.zeros((0, 4))
    return len(chosen) == 0 or bool(np.mean((chosen[:, 2] >= chosen[:, 0]) & (chosen[:, 3] >= chosen[:, 1])) >= 0.95)


def _confident(boxes: np.ndarray, scores: np.ndarray, softmax: bool,
               corners: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    fg = scores[:, 1:] if softmax else scores
    best, cls = fg.max(-1), fg.argmax(-1)
    keep = best >= 0.5
    chosen = boxes[keep].astype(np.float64)
    if not corners:
        chosen = np.concatenate([chosen[:, :2] - chosen[:, 2:] / 2, chosen[:, :2] + chosen[:, 2:] / 2], axis=1)
    return chosen, cls[keep], best[keep].astype(np.float64)


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    inter = float(np.prod(np.clip(np.minimum(a[2:], b[2:]) - np.maximum(a[:2], b[:2]), 0, None)))
    union = float(np.prod(np.clip(a[2:] - a[:2], 0, None)) + np.prod(np.clip(b[2:] - b[:2], 0, None))) - inter
    return inter / union if union > 0 else 0.0
