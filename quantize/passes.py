"""Produce one model variant with onnxruntime's quantization tooling or onnx float16 conversion."""

from __future__ import annotations

import heapq
import logging
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import onnx
from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    QuantFormat,
    QuantType,
    quantize_dynamic,
    quantize_static,
)
from onnxruntime.quantization.shape_inference import quant_pre_process
from onnxruntime.transformers.float16 import convert_float_to_float16

from edgecore.errors import ModelError
from quantize.calibration import stride_for
from quantize.recipe import Family, Recipe

__all__ = ["convert_fp16", "fp16_block_list", "lift_constants", "name_nodes", "prepare", "quantize_dynamic_weights",
           "quantize_int8", "sort_topologically"]

log = logging.getLogger(__name__)


def name_nodes(model: onnx.ModelProto) -> onnx.ModelProto:
    """Give every unnamed node a stable name, so nodes can be kept in float by name."""
    used = {node.name for node in model.graph.node if node.name}
    for index, node in enumerate(model.graph.node):
        if not node.name:
            name = f"{node.op_type}_{index}"
            while name in used:
                name += "_"
            node.name = name
            used.add(name)
    return model


def lift_constants(model: onnx.ModelProto) -> int:
    """Move top-level `Constant` node tensors into initializers (as onnxruntime does); returns how many.

    PaddlePaddle exports every weight as a Constant node; onnxruntime's quantizer only quantizes
    initializers, so without this such a model has nothing to quantize.
    """
    graph = model.graph
    lifted = [n for n in graph.node if n.op_type == "Constant" and n.domain in ("", "ai.onnx")
              and any(a.name == "value" and a.HasField("t") for a in n.attribute)]
    for node in lifted:
        tensor = onnx.TensorProto()
        tensor.CopyFrom(next(a.t for a in node.attribute if a.name == "value"))
        tensor.name = node.output[0]
        graph.initializer.append(tensor)
        graph.node.remove(node)
    return len(lifted)


def prepare(model: onnx.ModelProto) -> tuple[onnx.ModelProto, str | None]:
    """onnxruntime's recommended pre-processing (shape inference, basic fusions); a note if skipped."""
    with tempfile.TemporaryDirectory(prefix="edgectl-prep-") as tmp:
        src, dst = Path(tmp) / "in.onnx", Path(tmp) / "out.onnx"
        onnx.save(model, src)
        try:
            quant_pre_process(str(src), str(dst), skip_symbolic_shape=True)  # symbolic needs sympy
            return name_nodes(onnx.load(dst)), None
        except Exception as exc:  # the pre-processing is an optimisation; quantizing still works without it
            log.debug("quant_pre_process failed", exc_info=True)
            return model, f"onnxruntime quant_pre_process skipped: {str(exc).splitlines()[0][:120]}"


def quantize_int8(model: onnx.ModelProto, recipe: Recipe, reader: CalibrationDataReader | None,
                  method: CalibrationMethod, cache: Path, exclude: Iterable[str] = ()) -> onnx.ModelProto:
    """Static QDQ quantization; the calibration ranges are computed once and reused from `cache`."""
    extra: dict[str, object] = {
        "ActivationSymmetric": recipe.symmetric_activations,
        "WeightSymmetric": recipe.weight_type is QuantType.QInt8,
        "QuantizeBias": recipe.quantize_bias,
    }
    if method is CalibrationMethod.MinMax and reader is not None:
        # Ranges merged every `stride` samples: memory stays flat in the sample count. (Not
        # CalibMaxIntermediateOutputs: onnxruntime 1.31 drops the buffered outputs without using them.)
        extra["CalibStridedMinMax"] = stride_for(len(reader))
    if recipe.family is Family.QNN:
        extra["MinimumRealRange"] = 1e-4  # QNN rejects scales from near-zero ranges
    with tempfile.TemporaryDirectory(prefix="edgectl-q-") as tmp, _quiet_root_logger():
        src, out = Path(tmp) / "float.onnx", Path(tmp) / "q.onnx"
        onnx.save(model, src)  # a path, not a ModelProto: ORT's in-memory path mishandles external data
        kwargs = dict(
            quant_format=QuantFormat.QDQ, op_types_to_quantize=list(recipe.op_types or []) or None,
            per_channel=recipe.per_channel, reduce_range=recipe.reduce_range,
            activation_type=recipe.activation_type, weight_type=recipe.weight_type,
            nodes_to_exclude=sorted(exclude), calibrate_method=method, calibration_cache_path=cache,
        )
        try:
            try:
                quantize_static(src, out, reader if not cache.is_file() else None, extra_options=extra, **kwargs)
            except ValueError as exc:
                if "truth value" not in str(exc):
                    raise
                # onnxruntime 1.31 crashes adjusting weight scales for int32 biases when a bias is
                # fused with a per-channel weight (Gemm from MatMul+Add); skip that adjustment.
                extra["QDQDisableWeightAdjustForInt32Bias"] = True
                quantize_static(src, out, None if cache.is_file() else reader, extra_options=extra, **kwargs)
        except (ValueError, RuntimeError, KeyError, onnx.checker.ValidationError) as exc:
            raise ModelError(f"onnxruntime quantize_static failed: {_first_line(exc)}") from exc
        return _sorted(onnx.load(out))


def quantize_dynamic_weights(model: onnx.ModelProto, recipe: Recipe) -> onnx.ModelProto:
    """Dynamic quantization: int8 weights, activations quantized at run time."""
    with tempfile.TemporaryDirectory(prefix="edgectl-dq-") as tmp, _quiet_root_logger():
        src, out = Path(tmp) / "float.onnx", Path(tmp) / "dq.onnx"
        onnx.save(model, src)
        try:
            quantize_dynamic(src, out, per_channel=recipe.per_channel, reduce_range=recipe.reduce_range,
                             weight_type=QuantType.QInt8)
        except (ValueError, RuntimeError, KeyError) as exc:
            raise ModelError(f"onnxruntime quantize_dynamic failed: {_first_line(exc)}") from exc
        return _sorted(onnx.load(out))


def convert_fp16(model: onnx.ModelProto, recipe: Recipe, exclude: Iterable[str] = ()) -> onnx.ModelProto:
    """Float16 weights and compute (nodes in `exclude` stay float32); fp32 I/O unless the recipe says otherwise."""
    model = _initializers_not_inputs(model)
    blocked = fp16_block_list(model.graph, set(exclude))
    try:
        converted = convert_float_to_float16(model, keep_io_types=recipe.keep_io_types,
                                             node_block_list=sorted(blocked) or None)
    except (ValueError, RuntimeError) as exc:
        raise ModelError(f"float16 conversion failed: {_first_line(exc)}") from exc
    assert isinstance(converted, onnx.ModelProto)
    sort_topologically(converted.graph)  # the converter appends its input Casts after their readers
    return converted


def _sorted(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` in the node order onnx's checker wants: onnxruntime's own sort ignores what If/Loop bodies read."""
    sort_topologically(model.graph)
    return model


def sort_topologically(graph: onnx.GraphProto) -> None:
    """Reorder `graph`'s nodes (and every subgraph's) so each node comes after the producers of what it reads.

    Stable: nodes already in order keep it. A node inside a branch may read an outer tensor, so a
    control-flow node waits for what its bodies read from outside too. A cycle leaves the rest as it was.
    """
    for node in graph.node:
        for sub in _subgraphs(node):
            sort_topologically(sub)
    producers = {o: i for i, n in enumerate(graph.node) for o in n.output if o}
    waiting = [0] * len(graph.node)
    readers: list[list[int]] = [[] for _ in graph.node]
    for i, node in enumerate(graph.node):
        reads = [*node.input, *(t for g in _subgraphs(node) for t in _outer_names(g))]
        for p in {producers[t] for t in reads if t in producers and producers[t] != i}:
            waiting[i] += 1
            readers[p].append(i)
    ready = [i for i, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)  # the lowest original index first: nodes already in order keep it
    placed: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        placed.append(i)
        for r in readers[i]:
            waiting[r] -= 1
            if waiting[r] == 0:
                heapq.heappush(ready, r)
    if len(placed) < len(graph.node):  # a cycle: not ours to repair; the checker will name it
        placed += [i for i in range(len(graph.node)) if waiting[i] > 0]
    nodes = [graph.node[i] for i in placed]
    del graph.node[:]
    graph.node.extend(nodes)


def fp16_block_list(graph: onnx.GraphProto, keep: set[str]) -> set[str]:
    """The nodes of `keep` the float16 converter can keep float32 without breaking an If/Loop/Scan boundary.

    The converter keeps a blocked node's subgraphs float32 but hands every float tensor of the enclosing
    graph to them as float16 (a blocked producer's output is cast back to float16 under its own name), and
    it inserts its Casts in the top-level graph only. So a control-flow node whose branches read a float
    tensor from outside, or a node inside a branch, cannot stay float: onnxruntime would refuse the model
    ("Type (tensor(float)) of output arg ... does not match expected type (tensor(float16))"). Those are
    converted with the rest.
    """
    float_tensors = _float_tensors(graph)
    inner: set[str] = set()
    open_flows: set[str] = set()
    for node in graph.node:
        subgraphs = _subgraphs(node)
        inner |= {name for g in subgraphs for name in _node_names(g)}
        if any(t in float_tensors for g in subgraphs for t in _outer_names(g)):
            open_flows.add(node.name)
    return {name for name in keep if name not in inner and name not in open_flows}


def _float_tensors(graph: onnx.GraphProto) -> set[str]:
    """Names of float32 tensors of the top-level graph (inputs, initializers, typed values, untyped outputs)."""
    typed = {v.name: v.type.tensor_type.elem_type for v in [*graph.input, *graph.value_info, *graph.output]}
    names = {t.name for t in graph.initializer if t.data_type == onnx.TensorProto.FLOAT}
    names |= {n for n, t in typed.items() if t == onnx.TensorProto.FLOAT}
    # Without shape inference a node output has no type: count it float unless typed otherwise.
    names |= {o for node in graph.node for o in node.output if typed.get(o, onnx.TensorProto.FLOAT) == onnx.TensorProto.FLOAT}
    return names


def _subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    return [g for a in node.attribute for g in ([a.g] if a.HasField("g") else []) + list(a.graphs)]


def _node_names(graph: onnx.GraphProto) -> set[str]:
    names = {n.name for n in graph.node}
    for node in graph.node:
        for sub in _subgraphs(node):
            names |= _node_names(sub)
    return names


def _outer_names(graph: onnx.GraphProto) -> set[str]:
    """Tensors a subgraph (its own subgraphs included) reads from the scopes around it."""
    defined = {t.name for t in graph.initializer} | {i.name for i in graph.input}
    defined |= {o for n in graph.node for o in n.output}
    used = {i for n in graph.node for i in n.input if i}
    for node in graph.node:
        for sub in _subgraphs(node):
            used |= _outer_names(sub)
    return used - defined


def _initializers_not_inputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy without initializers listed as graph inputs (IR < 4 exporters list every weight there).

    With fp32 I/O kept, the float16 converter leaves every graph input float32, and an initializer listed
    as an input is one: mnist-8 came out with no weight converted at all.
    """
    inits = {t.name for t in model.graph.initializer}
    if not any(i.name in inits for i in model.graph.input):
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    kept = [i for i in copy.graph.input if i.name not in inits]
    del copy.graph.input[:]
    copy.graph.input.extend(kept)
    copy.ir_version = max(copy.ir_version, 4)  # IR 4 is where initializers stopped having to be inputs
    return copy


@contextmanager
def _quiet_root_logger() -> Iterator[None]:
    """onnxruntime.quantization logs advice on the root logger; keep it out of the CLI unless --debug."""
    root = logging.getLogger()
    level = root.level
    if level > logging.DEBUG:
        root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
