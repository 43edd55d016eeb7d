"""Which nodes an execution provider can take, decided by the tool that knows.

Each source returns one entry per node of the flat node list (main graph, then every If/Loop/Scan
body, see ``targets.graph.scopes``): ``None`` when the provider takes the node, else the reason
it cannot. Sources:

- ``ort-cpu``: ONNX Runtime itself (a CPU session recording its node assignment);
- ``ort-mobile-nnapi``, ``ort-mobile-coreml-neuralnetwork``, ``ort-mobile-coreml-mlprogram``:
  ONNX Runtime's mobile usability checker (``onnxruntime.tools.mobile_helpers``) with its op
  tables, run on the graph as ORT's partitioner sees it, bodies included;
- ``openvino``: ``openvino.Core().query_model`` when the device plugin is present, otherwise the
  profile's documented data table (the label says so);
- ``table``: a versioned operator table in ``configs/targets/*-ops.yaml`` (TensorRT, QNN);
- ``all-except``: everything except listed domains/ops (CUDA EP).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import onnx
import yaml

from edgecore.errors import ConfigError
from targets.graph import Scope
from targets.profile import ExecutionProvider, TargetProfile
from targets.shapes import is_static

__all__ = ["ORT_MOBILE_TABLES", "Support", "decide_support", "flat_nodes", "visible_static"]

Reasons = list[str | None]

# source -> (op table file shipped with onnxruntime, EP name in messages, max input rank the EP takes)
ORT_MOBILE_TABLES = {
    "ort-mobile-nnapi": ("nnapi_supported_ops.md", "NNAPI", 999),
    "ort-mobile-coreml-neuralnetwork": ("coreml_supported_neuralnetwork_ops.md", "CoreML NeuralNetwork", 5),
    "ort-mobile-coreml-mlprogram": ("coreml_supported_mlprogram_ops.md", "CoreML MLProgram", 5),
}


@dataclass(frozen=True)
class Support:
    """One provider's decision for every node, and where the decision came from."""

    provider: str
    source: str
    reasons: tuple[str | None, ...]


def flat_nodes(all_scopes: list[Scope]) -> list[onnx.NodeProto]:
    """Every node of every scope, in flat-index order."""
    return [node for scope in all_scopes for node in scope.graph.node]


def visible_static(all_scopes: list[Scope]) -> list[dict[str, bool]]:
    """Per scope: tensor name -> whether its shape is fully static, outer scopes included."""
    maps: list[dict[str, bool]] = []
    for scope in all_scopes:
        static = dict(maps[scope.parent]) if scope.parent is not None else {}
        graph = scope.graph
        for node in graph.node:  # outputs shape inference could not type count as dynamic
            for name in node.output:
                static[name] = False
        for info in list(graph.input) + list(graph.value_info) + list(graph.output):
            static[info.name] = is_static(info)
        for init in graph.initializer:
            static[init.name] = True
        maps.append(static)
    return maps


def decide_support(
    model: onnx.ModelProto, all_scopes: list[Scope], ep: ExecutionProvider, profile: TargetProfile
) -> Support:
    """Decide, node by node over every scope, whether ``ep`` takes each node of ``model``."""
    spec = ep.op_support
    nodes = flat_nodes(all_scopes)
    if spec.source == "ort-cpu":
        source, reasons = _ort_cpu(model, len(nodes))
    elif spec.source in ORT_MOBILE_TABLES:
        source, reasons = _ort_mobile(model, all_scopes, spec.source, spec.require_static_inputs)
    elif spec.source == "openvino":
        source, reasons = _openvino(model, nodes, ep, profile)
    elif spec.source == "table":
        source, reasons = _table(model, nodes, ep, profile)
    else:
        source, reasons = "all operators except the listed exclusions", [None] * len(nodes)
    reasons = _apply_generic_rules(all_scopes, ep, reasons)
    return Support(provider=ep.name, source=source, reasons=tuple(reasons))


def _op_key(node: onnx.NodeProto) -> str:
    return f"{node.domain or 'ai.onnx'}:{node.op_type}"


def _apply_generic_rules(all_scopes: list[Scope], ep: ExecutionProvider, reasons: Reasons) -> Reasons:
    """Profile-level exclusions and the static-shape requirement, on top of the source's answer."""
    spec = ep.op_support
    shapes = visible_static(all_scopes) if spec.require_static_inputs else []
    out: Reasons = []
    k = 0
    for s, scope in enumerate(all_scopes):
        for node in scope.graph.node:
            reason = reasons[k]
            k += 1
            if reason is None and (node.domain or "ai.onnx") in spec.excluded_domains:
                reason = f"domain {node.domain} has no {ep.name} kernels"
            elif reason is None and _op_key(node) in spec.excluded_ops:
                reason = f"{node.op_type} is excluded by {ep.name} by default"
            elif reason is None and spec.require_static_inputs and spec.source not in ORT_MOBILE_TABLES:
                # ORT's checker applied its own rule: it counts a value whose rank shape inference
                # left unknown (Loop/If outputs) as fixed, and onnxruntime's own inference resolves them
                dynamic = [name for name in node.input if name and not shapes[s].get(name, False)]
                if dynamic:
                    reason = f"dynamic shape: input {dynamic[0]!r} has no fixed shape"
            out.append(reason)
    return out


def _ort_cpu(model: onnx.ModelProto, count: int) -> tuple[str, Reasons]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    # the model is already optimized as ORT would; disabling keeps node names as they are
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    options.log_severity_level = 3
    source = f"onnxruntime {ort.__version__} CPU session node assignment"
    try:
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # ORT raises its own Fail/NotImplemented types
        message = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        return source, [f"onnxruntime cannot load the model: {message}"] * count
    assigned = {n.name for sub in session.get_provider_graph_assignment_info() for n in sub.get_nodes()}
    top = [None if n.name in assigned or n.op_type == "Constant" else "not assigned to CPUExecutionProvider"
           for n in model.graph.node]
    # nodes inside If/Loop/Scan bodies run on the CPU kernels of their loaded control-flow node
    return source, top + [None] * (count - len(top))


def _ort_mobile(model: onnx.ModelProto, all_scopes: list[Scope], source: str,
                require_static: bool) -> tuple[str, Reasons]:
    """ORT's checker on every graph and body; reasons say why it leaves a node out."""
    import onnxruntime
    from onnxruntime.tools.mobile_helpers import usability_checker

    table_name, ep_name, max_rank = ORT_MOBILE_TABLES[source]
    table = Path(usability_checker.__file__).parent / table_name
    ops = usability_checker._SupportedOpsChecker(str(table))
    graph = model.graph
    if require_static and not graph.value_info and len(graph.node) > 1 and graph.input:
        # the checker refuses graphs without value_info; the input's own info is already in its
        # lookup, so repeating it there changes no decision
        graph = onnx.GraphProto()
        graph.CopyFrom(model.graph)
        graph.value_info.append(graph.input[0])
    info = usability_checker.check_partitioning(graph, ops, require_static, max_rank)
    taken = {n.name for group in info.supported_groups for n in group}
    static = visible_static(all_scopes)
    reasons: Reasons = []
    for s, scope in enumerate(all_scopes):
        for node in scope.graph.node:
            dynamic = [n for n in node.input if n and not static[s].get(n, False)]
            if node.name in taken:
                reasons.append(None)
            elif not ops.is_op_supported(node):
                reasons.append(f"{_op_key(node)} is not in {ep_name} EP's supported ops ({table_name})")
            elif require_static and dynamic:
                reasons.append(f"dynamic shape: input {dynamic[0]!r} has no fixed shape ({ep_name} needs static shapes)")
            else:
                reasons.append(f"an input has rank above {max_rank}, which {ep_name} does not take")
    label = f"onnxruntime {onnxruntime.__version__} mobile usability checker ({table_name})"
    return label + (", static input shapes required" if require_static else ""), reasons


def _openvino(model: onnx.ModelProto, nodes: list[onnx.NodeProto], ep: ExecutionProvider,
              profile: TargetProfile) -> tuple[str, Reasons]:
    import openvino

    device = ep.op_support.device or "CPU"
    core = openvino.Core()
    if device in core.available_devices:
        top = _query_model(core, model, device)
        body = nodes[len(top):]
        if ep.op_support.table:
            inner = _table(model, body, ep, profile)[1]
        else:
            inner = ["OpenVINO query_model places an If/Loop/Scan body only with its control-flow node"] * len(body)
        return f"openvino {openvino.__version__} Core.query_model on {device}", top + inner
    if not ep.op_support.table:
        raise ConfigError(f"{profile.source_file}: OpenVINO device {device} is absent and the profile names no table")
    source, reasons = _table(model, nodes, ep, profile)
    return f"data table ({source}); OpenVINO {device} plugin absent here", reasons


def _query_model(core: Any, model: onnx.ModelProto, device: str) -> Reasons:
    from openvino.frontend import FrontEndManager

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.onnx"
        onnx.save(model, str(path))
        # keep the manager and input model referenced: freeing them unloads the frontend library
        # under the converted model and query_model then crashes
        manager = FrontEndManager()
        frontend = manager.load_by_framework("onnx")
        try:
            input_model = frontend.load(str(path))
            # convert_partially keeps unconvertible ops as framework nodes, which query_model leaves out
            ov_model = frontend.convert_partially(input_model)
            placed = set(core.query_model(ov_model, device))
        except RuntimeError as exc:  # e.g. sequence/map typed values (ZipMap) the frontend rejects
            why = next((ln for ln in str(exc).splitlines()[1:] if ln.strip() and "failed" not in ln), str(exc))
            return [f"OpenVINO ONNX frontend cannot load the model: {why.strip()[:200]}"] * len(model.graph.node)
        reasons = _placement_reasons(model, ov_model, placed, device)
        del ov_model, input_model, frontend, manager
    return reasons


def _placement_reasons(model: onnx.ModelProto, ov_model: Any, placed: set[str], device: str) -> Reasons:
    by_tensor: dict[str, list[str]] = {}
    for op in ov_model.get_ordered_ops():
        for output in op.outputs():
            for name in output.get_names():
                by_tensor.setdefault(name, []).append(op.get_friendly_name())
    reasons: Reasons = []
    for node in model.graph.node:
        ops = [op for name in node.output for op in by_tensor.get(name, [])] or [node.name]
        missing = [op for op in ops if op not in placed]
        # a node OpenVINO folded away entirely (e.g. Identity) leaves no op and costs nothing
        folded = not any(name in by_tensor for name in node.output) and node.name not in placed
        if missing and not folded:
            reasons.append(f"OpenVINO {device} query_model does not place {_op_key(node)}")
        else:
            reasons.append(None)
    return reasons


@lru_cache(maxsize=16)
def _load_table(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot read op table: {str(exc).splitlines()[0]}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("versions"), dict):
        raise ConfigError(f"{path}: key 'versions': missing or not a mapping")
    return data


def _table(model: onnx.ModelProto, nodes: list[onnx.NodeProto], ep: ExecutionProvider,
           profile: TargetProfile) -> tuple[str, Reasons]:
    spec = ep.op_support
    path = profile.source_file.parent / str(spec.table)
    data = _load_table(path)
    version = data["versions"].get(spec.table_version)
    if not isinstance(version, dict) or not isinstance(version.get("supported"), list):
        raise ConfigError(f"{path}: key 'versions.{spec.table_version}.supported': missing")
    supported = set(version["supported"])
    constraints: dict[str, Any] = version.get("constraints") or {}
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    max_opset = int(version.get("max_opset", 999))
    constants = {i.name for i in _all_initializers(model.graph)}
    constants |= {o for n in nodes if n.op_type == "Constant" for o in n.output}
    reasons: Reasons = []
    for node in nodes:
        reasons.append(_table_reason(node, supported, constraints, constants, opset, max_opset, spec.table_version))
    return f"{path.name} version {spec.table_version} ({version.get('source', 'no source')})", reasons


def _all_initializers(graph: onnx.GraphProto) -> list[onnx.TensorProto]:
    found = list(graph.initializer)
    for node in graph.node:
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                found += _all_initializers(sub)
    return found


def _table_reason(
    node: onnx.NodeProto,
    supported: set[str],
    constraints: dict[str, Any],
    constants: set[str],
    opset: int,
    max_opset: int,
    version: str | None,
) -> str | None:
    if node.domain not in ("", "ai.onnx"):
        return f"{_op_key(node)}: domain not supported by the {version} table"
    if node.op_type not in supported:
        return f"{node.op_type} is not in the {version} op table"
    if opset > max_opset:
        return f"opset {opset} is newer than the {version} table's maximum {max_opset}"
    rule = constraints.get(node.op_type) or {}
    for index in rule.get("constant_inputs", []):
        if index < len(node.input) and node.input[index] and node.input[index] not in constants:
            return f"{node.op_type} input {index} ({node.input[index]!r}) must be a constant: {rule.get('note', '')}"
    return None
