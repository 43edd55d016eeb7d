"""Which top-level nodes an execution provider can take, decided by the tool that knows.

Each source returns one entry per node of ``model.graph.node``: ``None`` when the provider takes
the node, else the reason it cannot. Sources:

- ``ort-cpu``: ONNX Runtime itself (a CPU session recording its node assignment);
- ``ort-mobile-nnapi``: ONNX Runtime's mobile usability checker and its nnapi_supported_ops.md;
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

from agent.errors import ConfigError
from targets.profile import ExecutionProvider, TargetProfile

__all__ = ["Support", "decide_support"]

Reasons = list[str | None]


@dataclass(frozen=True)
class Support:
    """One provider's decision for every node, and where the decision came from."""

    provider: str
    source: str
    reasons: tuple[str | None, ...]


def decide_support(model: onnx.ModelProto, ep: ExecutionProvider, profile: TargetProfile) -> Support:
    """Decide, node by node, whether ``ep`` takes each top-level node of ``model``."""
    spec = ep.op_support
    if spec.source == "ort-cpu":
        source, reasons = _ort_cpu(model)
    elif spec.source == "ort-mobile-nnapi":
        source, reasons = _ort_nnapi(model, spec.require_static_inputs)
    elif spec.source == "openvino":
        source, reasons = _openvino(model, ep, profile)
    elif spec.source == "table":
        source, reasons = _table(model, ep, profile)
    else:
        source, reasons = "all operators except the listed exclusions", [None] * len(model.graph.node)
    reasons = _apply_generic_rules(model, ep, reasons)
    return Support(provider=ep.name, source=source, reasons=tuple(reasons))


def _op_key(node: onnx.NodeProto) -> str:
    return f"{node.domain or 'ai.onnx'}:{node.op_type}"


def _apply_generic_rules(model: onnx.ModelProto, ep: ExecutionProvider, reasons: Reasons) -> Reasons:
    """Profile-level exclusions and the static-shape requirement, on top of the source's answer."""
    spec = ep.op_support
    shapes = _value_shapes(model) if spec.require_static_inputs else {}
    out: Reasons = []
    for node, reason in zip(model.graph.node, reasons, strict=False):
        if reason is None and (node.domain or "ai.onnx") in spec.excluded_domains:
            reason = f"domain {node.domain} has no {ep.name} kernels"
        elif reason is None and _op_key(node) in spec.excluded_ops:
            reason = f"{node.op_type} is excluded by {ep.name} by default"
        elif reason is None and spec.require_static_inputs:
            dynamic = [name for name in node.input if name and shapes.get(name, True) is False]
            if dynamic:
                reason = f"dynamic shape: input {dynamic[0]!r} has no fixed shape"
        out.append(reason)
    return out


def _value_shapes(model: onnx.ModelProto) -> dict[str, bool]:
    """Tensor name -> whether its shape is fully static (initializers are)."""
    static: dict[str, bool] = {}
    graph = model.graph
    for info in list(graph.input) + list(graph.value_info) + list(graph.output):
        tensor = info.type.tensor_type
        static[info.name] = tensor.HasField("shape") and all(d.HasField("dim_value") for d in tensor.shape.dim)
    for node in graph.node:  # outputs shape inference could not type count as dynamic
        for name in node.output:
            static.setdefault(name, False)
    for init in graph.initializer:
        static[init.name] = True
    return static


def _ort_cpu(model: onnx.ModelProto) -> tuple[str, Reasons]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    # Without optimizations the session keeps the original nodes, so names match node for node.
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    source = f"onnxruntime {ort.__version__} CPU session node assignment"
    try:
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # ORT raises its own Fail/NotImplemented types
        message = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        return source, [f"onnxruntime cannot load the model: {message}"] * len(model.graph.node)
    assigned = {n.name for sub in session.get_provider_graph_assignment_info() for n in sub.get_nodes()}
    # ORT turns Constant nodes into initializers while loading, so they are never assigned
    return source, [
        None if n.name in assigned or n.op_type == "Constant" else "not assigned to CPUExecutionProvider"
        for n in model.graph.node
    ]


def _ort_nnapi(model: onnx.ModelProto, require_static: bool) -> tuple[str, Reasons]:
    import onnxruntime
    from onnxruntime.tools.mobile_helpers import usability_checker

    table = Path(usability_checker.__file__).parent / "nnapi_supported_ops.md"
    ops = usability_checker._SupportedOpsChecker(str(table))
    try:
        info = usability_checker.check_nnapi_partitions(model, require_static)
    except ValueError:  # the checker wants value_info; a model with no intermediate tensors has none
        info = usability_checker.check_nnapi_partitions(model, False)
    in_groups = {n.name for group in info.supported_groups for n in group}
    reasons: Reasons = []
    for node in model.graph.node:
        if node.name in in_groups:
            reasons.append(None)
        elif not ops.is_op_supported(node):
            reasons.append(f"{_op_key(node)} is not in NNAPI EP's supported ops")
        else:
            reasons.append("dynamic shape: an input has no fixed shape (NNAPI needs static shapes)")
    return f"onnxruntime {onnxruntime.__version__} mobile usability checker (nnapi_supported_ops.md)", reasons


def _openvino(model: onnx.ModelProto, ep: ExecutionProvider, profile: TargetProfile) -> tuple[str, Reasons]:
    import openvino

    device = ep.op_support.device or "CPU"
    core = openvino.Core()
    if device in core.available_devices:
        return f"openvino {openvino.__version__} Core.query_model on {device}", _query_model(core, model, device)
    if not ep.op_support.table:
        raise ConfigError(f"{profile.source_file}: OpenVINO device {device} is absent and the profile names no table")
    source, reasons = _table(model, ep, profile)
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


def _table(model: onnx.ModelProto, ep: ExecutionProvider, profile: TargetProfile) -> tuple[str, Reasons]:
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
    constants = {i.name for i in model.graph.initializer}
    constants |= {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    reasons: Reasons = []
    for node in model.graph.node:
        reasons.append(_table_reason(node, supported, constraints, constants, opset, max_opset, spec.table_version))
    return f"{path.name} version {spec.table_version} ({version.get('source', 'no source')})", reasons


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
