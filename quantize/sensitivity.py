"""Per-tensor quantization error (onnxruntime qdq_loss_debug) and the nodes that keep a tensor float."""

from __future__ import annotations

import math
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnxruntime.quantization.qdq_loss_debug import (
    collect_activations,
    compute_activation_error,
    create_activation_matching,
    modify_model_output_intermediate_tensors,
)

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


def tensor_errors(float_model: onnx.ModelProto, qdq_model: onnx.ModelProto, samples: SampleSet) -> list[TensorError]:
    """The error of every quantized activation, in the float graph's topological order."""
    with tempfile.TemporaryDirectory(prefix="edgectl-sens-") as tmp:
        float_acts = _activations(float_model, Path(tmp) / "float", samples)
        qdq_acts = _activations(qdq_model, Path(tmp) / "qdq", samples)
    matching = create_activation_matching(qdq_acts, float_acts)
    errors = compute_activation_error(matching)  # whole-tensor SQNR, as qdq_loss_debug defines it
    local = compute_activation_error(matching, err_func=worst_channel_sqnr)
    order = _graph_order(float_model)
    result = [
        TensorError(name, _db(local[name]["qdq_err"]), _db(err.get("xmodel_err", math.inf)),
                    _nodes_around(float_model, name))
        for name, err in errors.items()
        if name in order
    ]
    return sorted(result, key=lambda e: order[e.tensor])


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


def _activations(model: onnx.ModelProto, stem: Path, samples: SampleSet) -> dict[str, list[object]]:
    src, aug = stem.with_suffix(".onnx"), stem.with_suffix(".aug.onnx")
    onnx.save(model, src)
    modify_model_output_intermediate_tensors(str(src), str(aug))
    activations: dict[str, list[object]] = collect_activations(str(aug), samples)  # any iterable of feeds works
    return activations


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
