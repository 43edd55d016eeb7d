"""The graph as execution providers receive it: after onnxruntime's basic optimizations.

ONNX Runtime applies its level-1 (basic) graph transformers before it asks any execution
provider which nodes it takes: Constant nodes become initializers, constant subgraphs fold,
Identity/Dropout go, Conv+BatchNorm fuse, and a YOLOv5 Focus block (four strided Slices and a
Concat) becomes SpaceToDepth. Its mobile usability checker analyses that optimized graph, so the
analysis does too: the model is optimized here with ``SessionOptions.optimized_model_filepath``
at ``ORT_ENABLE_BASIC``, exactly as ``onnxruntime.tools.onnx_model_utils.optimize_model`` does.
"""

from __future__ import annotations

import hashlib
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import onnx

from targets.graph import scopes
from targets.shapes import normalise_dims

__all__ = ["RuntimeGraph", "prepare_model", "runtime_graph"]


@dataclass(frozen=True)
class RuntimeGraph:
    """The optimized, shape-inferred model, and how it was obtained."""

    model: onnx.ModelProto
    note: str
    refusal: str | None = None  # why onnxruntime cannot load the model (None when it loads)


def prepare_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model as onnxruntime's partitioner sees it (see ``runtime_graph``)."""
    return runtime_graph(model).model


def runtime_graph(model: onnx.ModelProto) -> RuntimeGraph:
    """Optimize at onnxruntime's basic level, then name every node uniquely and infer shapes.

    When onnxruntime cannot load the model the graph is analysed as given (Constant nodes
    still become initializers) and ``note`` says why.
    """
    data = model.SerializeToString()
    prepared, note, refusal = _cached(hashlib.sha256(data).hexdigest(), data)
    copy = onnx.ModelProto()
    copy.CopyFrom(prepared)  # callers may edit what they get
    return RuntimeGraph(copy, note, refusal)


@lru_cache(maxsize=8)
def _cached(digest: str, data: bytes) -> tuple[onnx.ModelProto, str, str | None]:
    model = onnx.ModelProto()
    model.ParseFromString(data)
    normalise_dims(model)
    optimized, note, refusal = _optimize(model)
    if optimized is None:
        optimized = model
        _constants_to_initializers(optimized.graph)
    _name_nodes(optimized)
    return _infer(optimized), note, refusal


def _optimize(model: onnx.ModelProto) -> tuple[onnx.ModelProto | None, str, str | None]:
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        source, target = Path(tmp) / "model.onnx", Path(tmp) / "optimized.onnx"
        onnx.save(model, str(source))
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = str(target)
        options.log_severity_level = 3  # removed unused initializers are not news
        # external initializers keep models over 2 GB saveable, as ORT's own optimize_model does
        options.add_session_config_entry("session.optimized_model_external_initializers_file_name", "weights.bin")
        try:
            ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
            optimized = onnx.load(str(target))
        except Exception as exc:  # ORT raises its own Fail/InvalidGraph/NotImplemented types
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            return None, f"graph as given: onnxruntime {ort.__version__} cannot load it ({first})", first
    return optimized, f"graph after onnxruntime {ort.__version__} basic optimizations (what its partitioner sees)", None


def _constants_to_initializers(graph: onnx.GraphProto) -> None:
    for node in [n for n in graph.node if n.op_type == "Constant" and not n.domain]:
        value = next((a.t for a in node.attribute if a.name == "value" and a.HasField("t")), None)
        if value is None:
            continue
        tensor = onnx.TensorProto()
        tensor.CopyFrom(value)
        tensor.name = node.output[0]
        graph.initializer.append(tensor)
        graph.node.remove(node)


def _name_nodes(model: onnx.ModelProto) -> None:
    """Unique names across the main graph and every body: reports and partitions refer to them."""
    seen: set[str] = set()
    k = 0
    for scope in scopes(model.graph):
        for node in scope.graph.node:
            if not node.name or node.name in seen:
                node.name = f"{node.op_type}_{k}"
                while node.name in seen:
                    k += 1
                    node.name = f"{node.op_type}_{k}"
            seen.add(node.name)
            k += 1


def _infer(model: onnx.ModelProto) -> onnx.ModelProto:
    """Shape inference as ORT's checker runs it (strict), relaxed when strict fails."""
    for strict in (True, False):
        try:
            inferred = onnx.shape_inference.infer_shapes(model, strict_mode=strict)
        except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError):
            continue
        _control_flow_outputs(inferred.graph)
        return inferred
    return model  # analysis still works; shape rules then see dynamic shapes


def _control_flow_outputs(graph: onnx.GraphProto) -> None:
    """Give Loop carried outputs and If outputs the shape their bodies declare, as onnxruntime infers them.

    ONNX shape inference leaves them without a rank; a partition piece needs one on its inputs.
    """
    known = {v.name: v for v in list(graph.value_info) + list(graph.output)}
    for node in graph.node:
        bodies = {a.name: a.g for a in node.attribute if a.HasField("g")}
        if node.op_type == "Loop" and "body" in bodies:
            pairs = list(zip(node.output, bodies["body"].output[1:], strict=False))[: len(node.input) - 2]
        elif node.op_type == "If" and {"then_branch", "else_branch"} <= set(bodies):
            then, other = bodies["then_branch"].output, bodies["else_branch"].output
            pairs = [(o, t) for o, t, e in zip(node.output, then, other, strict=False) if t.type == e.type]
        else:
            continue
        for name, body_out in pairs:
            current = known.get(name)
            if body_out.type.tensor_type.HasField("shape") and (
                    current is None or not current.type.tensor_type.HasField("shape")):
                info = current if current is not None else graph.value_info.add()
                info.name = name
                info.type.CopyFrom(body_out.type)
