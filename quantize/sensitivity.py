"""Per-tensor quantization error (onnxruntime qdq_loss_debug) and the nodes that keep a tensor float."""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization.qdq_loss_debug import (
    create_activation_matching,
    modify_model_output_intermediate_tensors,
)

from edgecore.errors import ModelError
from quantize.samples import SampleSet

__all__ = ["TensorError", "tensor_errors", "worst_channel_sqnr"]

_CAP_DB = 100.0  # SQNR of an exact tensor; keeps JSON finite


@dataclass(frozen=True)
class TensorError:
    """How much quantizing one activation hurts, and the float-model nodes around it."""

    tensor: str
    qdq_sqnr: float  # dB, worst channel of the tensor's own quantization noise (low = sensitive)
    xmodel_sqnr: float  # dB, the accumulated error against the float model at this point
    nodes: tuple[str, ...]  # producer and consumers: keeping these float removes the tensor's QDQ

    def to_dict(self) -> dict[str, object]:
        """JSON-ready."""
        return {"tensor": self.tensor, "qdq_sqnr_db": self.qdq_sqnr, "xmodel_sqnr_db": self.xmodel_sqnr,
                "nodes": list(self.nodes)}


_SAVED = "_ReshapedSavedOutput"  # the suffix modify_model_output_intermediate_tensors gives saved tensors


@dataclass
class _Energy:
    """Sums of squares over the samples seen so far: enough for an SQNR without keeping any tensor."""

    pre: float = 0.0  # QDQ model, the activation before its QuantizeLinear
    qdq_noise: float = 0.0  # (before - after QDQ)^2
    float_: float = 0.0  # float model, the same activation
    xmodel_noise: float = 0.0  # (float - after QDQ)^2
    has_float: bool = False


def tensor_errors(float_model: onnx.ModelProto, qdq_model: onnx.ModelProto, samples: SampleSet) -> list[TensorError]:
    """The error of every quantized activation, in the float graph's topological order.

    Streams: one sample's activations (float and QDQ model) are in memory at a time, reduced to sums of
    squares before the next. qdq_loss_debug's collect_activations keeps every activation of every
    sample, which on a 512x896 segmentation net is about 1 GB per sample and model.
    """
    energies: dict[str, _Energy] = {}
    with tempfile.TemporaryDirectory(prefix="edgectl-sens-") as tmp:
        try:
            float_run = _augmented_session(float_model, Path(tmp) / "float")
            qdq_run = _augmented_session(qdq_model, Path(tmp) / "qdq")
            for feeds in samples:
                matching = create_activation_matching(qdq_run(feeds), float_run(feeds))
                for name, match in matching.items():
                    _accumulate(energies.setdefault(name, _Energy()), match)
                del matching
        except Exception as exc:  # onnxruntime's Fail/InvalidArgument types: the saved activations do not load or run
            raise ModelError(f"onnxruntime cannot run the models with their activations saved: "
                             f"{(str(exc).splitlines() or [type(exc).__name__])[0][:200]}") from exc
    order = _graph_order(float_model)
    result = [
        TensorError(name, _db(_sqnr(e.pre, e.qdq_noise)), _db(_sqnr(e.float_, e.xmodel_noise) if e.has_float
                                                             else math.inf),
                    _nodes_around(float_model, name))
        for name, e in energies.items()
        if name in order
    ]
    return sorted(result, key=lambda e: order[e.tensor])


def _accumulate(energy: _Energy, match: dict[str, Sequence[np.ndarray]]) -> None:
    post = np.asarray(match["post_qdq"][0], dtype=np.float64)
    pre = np.asarray(match["pre_qdq"][0], dtype=np.float64)
    energy.pre += float(np.sum(pre * pre))
    energy.qdq_noise += float(np.sum((pre - post) ** 2))
    floats = match.get("float")
    if floats:
        ref = np.asarray(floats[0], dtype=np.float64)
        energy.has_float = True
        energy.float_ += float(np.sum(ref * ref))
        energy.xmodel_noise += float(np.sum((ref - post) ** 2))


def _sqnr(signal2: float, noise2: float) -> float:
    """SQNR in dB from sums of squares (an all-zero signal counts as exact, as worst_channel_sqnr does)."""
    if signal2 <= 0:
        return _CAP_DB
    eps = np.finfo(np.float64).eps
    return float(20 * math.log10(math.sqrt(signal2) / max(math.sqrt(noise2), eps)))


def worst_channel_sqnr(x: Sequence[np.ndarray] | np.ndarray, y: Sequence[np.ndarray] | np.ndarray) -> float:
    """SQNR (dB) of the worst non-empty channel (axis 1).

    A whole-tensor SQNR hides channels that one outlier channel's range crushes to zero; those
    are the layers that lose accuracy, so rank by the worst channel.
    """
    a = np.concatenate(list(x) if not isinstance(x, np.ndarray) else [x]).astype(np.float64)
    b = np.concatenate(list(y) if not isinstance(y, np.ndarray) else [y]).astype(np.float64)
    if a.ndim >= 2:
        a, b = np.moveaxis(a, 1, 0).reshape(a.shape[1], -1), np.moveaxis(b, 1, 0).reshape(b.shape[1], -1)
    else:
        a, b = a.reshape(1, -1), b.reshape(1, -1)
    signal, noise = np.linalg.norm(a, axis=1), np.linalg.norm(a - b, axis=1)
    alive = signal > 0
    if not alive.any():
        return _CAP_DB
    eps = np.finfo(np.float64).eps
    return float(np.min(20 * np.log10(signal[alive] / np.maximum(noise[alive], eps))))


def _augmented_session(model: onnx.ModelProto, stem: Path) -> Callable[[dict[str, np.ndarray]], dict[str, list[np.ndarray]]]:
    """A function from one sample to every saved activation of `model` (as collect_activations, one sample)."""
    src, aug = stem.with_suffix(".onnx"), stem.with_suffix(".aug.onnx")
    onnx.save(model, src)
    modify_model_output_intermediate_tensors(str(src), str(aug))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # as collect_activations
    options.enable_cpu_mem_arena = False  # give each sample's buffers back instead of growing an arena
    session = ort.InferenceSession(str(aug), sess_options=options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]

    def run(feeds: dict[str, np.ndarray]) -> dict[str, list[np.ndarray]]:
        values = session.run(None, feeds)
        return {n[: -len(_SAVED)]: [v] for n, v in zip(names, values, strict=True) if n.endswith(_SAVED)}

    return run


def _graph_order(model: onnx.ModelProto) -> dict[str, int]:
    order: dict[str, int] = {i.name: -1 for i in model.graph.input}
    for index, node in enumerate(model.graph.node):
        for out in node.output:
            order.setdefault(out, index)
    return order


def _nodes_around(model: onnx.ModelProto, tensor: str) -> tuple[str, ...]:
    names = [n.name for n in model.graph.node if tensor in n.output or tensor in n.input]
    return tuple(dict.fromkeys(names))


def _db(value: float) -> float:
    return round(min(float(value), _CAP_DB), 3) if math.isfinite(value) else _CAP_DB
