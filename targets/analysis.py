"""What runs where: per-node provider, partitions, accelerator share, verdict and advice."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import onnx

from targets.flops import estimate_flops
from targets.graph import Group, boundary, group_nodes
from targets.profile import TargetProfile
from targets.support import Support, decide_support

__all__ = ["Analysis", "NodeAssignment", "Partition", "analyse", "prepare_model"]


@dataclass(frozen=True)
class NodeAssignment:
    """Where one top-level node runs and why it does not run on the providers before it."""

    index: int
    name: str
    op_type: str
    domain: str
    provider: str
    accelerator: bool
    flops: int
    reasons: tuple[str, ...]  # "Provider: why not", for each higher-priority provider


@dataclass(frozen=True)
class Partition:
    """A run of consecutive nodes on one provider, with the tensors crossing its border."""

    index: int
    provider: str
    accelerator: bool
    nodes: tuple[int, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    flops: int


@dataclass(frozen=True)
class Analysis:
    """The answer to "what will run where on this target, and is it worth it"."""

    target: str
    nodes: tuple[NodeAssignment, ...]
    partitions: tuple[Partition, ...]
    accelerator_partitions: int
    accelerator_node_share: float
    accelerator_flops_share: float
    verdict: str  # YES, MAYBE or NO
    reason: str
    advice: tuple[str, ...]
    merges: tuple[str, ...]
    sources: dict[str, str]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, stable keys (used by --json, packaging and the quantize helper)."""
        return {
            "target": self.target,
            "verdict": self.verdict,
            "reason": self.reason,
            "advice": list(self.advice),
            "accelerator_partitions": self.accelerator_partitions,
            "accelerator_node_share": round(self.accelerator_node_share, 4),
            "accelerator_flops_share": round(self.accelerator_flops_share, 4),
            "sources": dict(self.sources),
            "merges": list(self.merges),
            "partitions": [
                {**vars(p), "nodes": [self.nodes[i].name for i in p.nodes], "inputs": list(p.inputs),
                 "outputs": list(p.outputs)}
                for p in self.partitions
            ],
            "nodes": [{**vars(n), "reasons": list(n.reasons)} for n in self.nodes],
        }


def prepare_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy with Constant nodes as initializers, a unique name on every node, inferred shapes.

    ONNX Runtime turns Constant nodes into initializers before any provider sees the graph;
    doing the same keeps constants from showing up as partition boundary tensors.
    """
    prepared = onnx.ModelProto()
    prepared.CopyFrom(model)
    graph = prepared.graph
    constants = [n for n in graph.node if n.op_type == "Constant" and not n.domain and _constant_value(n)]
    for node in constants:
        tensor = onnx.TensorProto()
        tensor.CopyFrom(_constant_value(node))  # type: ignore[arg-type]
        tensor.name = node.output[0]
        graph.initializer.append(tensor)
        graph.node.remove(node)
    seen: set[str] = set()
    for i, node in enumerate(prepared.graph.node):
        if not node.name or node.name in seen:
            node.name = f"{node.op_type}_{i}"
        seen.add(node.name)
    try:
        return onnx.shape_inference.infer_shapes(prepared)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError):
        return prepared  # analysis still works; shape-dependent rules then see dynamic shapes


def _constant_value(node: onnx.NodeProto) -> onnx.TensorProto | None:
    return next((a.t for a in node.attribute if a.name == "value" and a.HasField("t")), None)


def analyse(
    model: onnx.ModelProto,
    profile: TargetProfile,
    *,
    min_partition_nodes: int | None = None,
    max_partitions: int | None = None,
) -> Analysis:
    """Analyse ``model`` for ``profile``; limits default to the profile's partition policy."""
    model = prepare_model(model)
    supports = [decide_support(model, ep, profile) for ep in profile.execution_providers]
    accel = [ep.accelerator for ep in profile.execution_providers]
    choice = [_first_supporting(supports, i) for i in range(len(model.graph.node))]
    flops = estimate_flops(model)
    limits = (min_partition_nodes or profile.partition.min_partition_nodes,
              max_partitions or profile.partition.max_partitions)
    merges = _apply_fragmentation_policy(model, supports, accel, choice, flops, *limits)
    nodes = tuple(_assignment(model, supports, accel, choice, flops, i) for i in range(len(choice)))
    groups = group_nodes(model.graph, choice)
    partitions = tuple(_partition(model, supports, accel, g, flops, k) for k, g in enumerate(groups))
    device_groups = [g for g in group_nodes(model.graph, [accel[c] for c in choice]) if g.label]
    on_accel = [n for n in nodes if n.accelerator]
    total_flops = sum(flops) or 1
    node_share = len(on_accel) / max(len(nodes), 1)
    flops_share = sum(n.flops for n in on_accel) / total_flops
    verdict, reason = _verdict(profile, supports, nodes, len(device_groups), node_share, flops_share)
    return Analysis(
        target=profile.name,
        nodes=nodes,
        partitions=partitions,
        accelerator_partitions=len(device_groups),
        accelerator_node_share=node_share,
        accelerator_flops_share=flops_share,
        verdict=verdict,
        reason=reason,
        advice=tuple(_advice(model, profile, nodes, verdict)),
        merges=tuple(merges),
        sources={s.provider: s.source for s in supports},
    )


def _first_supporting(supports: list[Support], node: int, after: int = -1) -> int:
    """Index of the first provider after ``after`` that takes the node; the last (CPU) otherwise."""
    for k in range(after + 1, len(supports)):
        if supports[k].reasons[node] is None:
            return k
    return len(supports) - 1


def _apply_fragmentation_policy(
    model: onnx.ModelProto, supports: list[Support], accel: list[bool], choice: list[int],
    flops: list[int], min_nodes: int, max_parts: int,
) -> list[str]:
    """Demote too-small partitions, then the cheapest ones past the limit; say what moved and why."""
    merges: list[str] = []
    while True:
        small = [g for g in group_nodes(model.graph, choice) if accel[g.label] and len(g.nodes) < min_nodes]
        if small:
            for g in small:
                for i in g.nodes:
                    choice[i] = _first_supporting(supports, i, after=g.label)
                merges.append(_merge_note(model, supports, g, choice, supports[g.label].provider,
                                          f"fewer than {min_nodes} nodes"))
            continue
        device = [g for g in group_nodes(model.graph, [accel[c] for c in choice]) if g.label]
        if len(device) <= max_parts:
            return merges
        cheapest = min(device, key=lambda g: (sum(flops[i] for i in g.nodes), len(g.nodes)))
        for i in cheapest.nodes:
            choice[i] = len(supports) - 1
        merges.append(_merge_note(model, supports, cheapest, choice, "the accelerator",
                                  f"more than {max_parts} accelerator partitions; this one has the fewest FLOPs"))


def _merge_note(
    model: onnx.ModelProto, supports: list[Support], group: Group, choice: list[int], old: str, why: str
) -> str:
    names = [model.graph.node[i].name for i in group.nodes]
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    return f"{len(names)} node(s) [{shown}] moved from {old} to {supports[choice[group.nodes[0]]].provider}: {why}"


def _assignment(
    model: onnx.ModelProto, supports: list[Support], accel: list[bool], choice: list[int], flops: list[int], i: int
) -> NodeAssignment:
    node = model.graph.node[i]
    reasons = tuple(f"{s.provider}: {s.reasons[i] or 'moved by partition policy'}" for s in supports[: choice[i]])
    if supports[choice[i]].reasons[i] is not None:  # not even the CPU fallback takes it
        reasons += (f"{supports[choice[i]].provider}: {supports[choice[i]].reasons[i]}",)
    return NodeAssignment(i, node.name, node.op_type, node.domain or "ai.onnx", supports[choice[i]].provider,
                          accel[choice[i]], flops[i], reasons)


def _partition(
    model: onnx.ModelProto, supports: list[Support], accel: list[bool], group: Group, flops: list[int], k: int
) -> Partition:
    inputs, outputs = boundary(model.graph, group.nodes)
    return Partition(k, supports[group.label].provider, accel[group.label], group.nodes, tuple(inputs),
                     tuple(outputs), sum(flops[i] for i in group.nodes))


def _verdict(
    profile: TargetProfile, supports: list[Support], nodes: tuple[NodeAssignment, ...],
    parts: int, node_share: float, flops_share: float,
) -> tuple[str, str]:
    """ORT's usability thresholds: one partition over 75% is good, more than two is poor."""
    cpu = supports[-1]
    broken = [n for n in nodes if cpu.reasons[n.index] is not None and not n.accelerator]
    if broken:
        return "NO", f"{broken[0].name} ({broken[0].op_type}) cannot run at all: {cpu.reasons[broken[0].index]}"
    if not profile.accelerator_providers:
        return "YES", f"all {len(nodes)} nodes run on {cpu.provider}"
    pct = f"{node_share:.0%} of nodes, {flops_share:.0%} of FLOPs"
    if parts == 0:
        return "NO", "no node runs on the accelerator"
    if parts == 1 and node_share > 0.75:
        return "YES", f"1 accelerator partition: {pct}"
    if (parts == 1 and node_share > 0.5) or (parts == 2 and node_share > 0.75):
        return "MAYBE", f"{parts} accelerator partition(s): {pct}"
    return "NO", f"{parts} accelerator partition(s): only {pct}"


def _advice(model: onnx.ModelProto, profile: TargetProfile, nodes: tuple[NodeAssignment, ...], verdict: str) -> list[str]:
    advice: list[str] = []
    reasons = [r for n in nodes for r in n.reasons]
    dynamic_inside = any("dynamic shape" in r for r in reasons)
    if _has_dynamic_input(model) and (dynamic_inside or profile.shape.static_required):
        example = " ".join(f"--static-shape {name}={dims}" for name, dims in _input_dims(model))
        advice.append(f"fix input shapes with `{example}` (replace N with the batch size you deploy)")
    elif dynamic_inside:
        advice.append("inputs are static but shapes computed inside the graph (Shape->Reshape) stay dynamic: "
                      "constant-fold them (e.g. onnxsim) so the accelerator sees fixed shapes")
    if profile.precision.format not in ("fp32",) and _is_float_model(model):
        advice.append(f"quantize for {profile.name}: {profile.precision.format} "
                      f"({profile.precision.activations} activations, {profile.precision.weights} weights)")
    blocked = sorted({f"{n.domain}:{n.op_type}" for n in nodes if not n.accelerator and n.reasons})
    if blocked and profile.accelerator_providers:
        advice.append(f"these ops stay on the CPU: {', '.join(blocked[:8])}; replace them or accept the fallback")
    if verdict == "NO" and profile.accelerator_providers:
        advice.append("this target gains little: consider a CPU profile (cpu-x86 / cpu-arm)")
    return advice


def _has_dynamic_input(model: onnx.ModelProto) -> bool:
    return any("N" in dims.split("x") for _, dims in _input_dims(model))


def _input_dims(model: onnx.ModelProto) -> list[tuple[str, str]]:
    initializers = {t.name for t in model.graph.initializer}
    out = []
    for info in model.graph.input:
        if info.name in initializers or not info.type.HasField("tensor_type"):
            continue
        dims = [str(d.dim_value) if d.HasField("dim_value") else "N" for d in info.type.tensor_type.shape.dim]
        out.append((info.name, "x".join(dims) or "1"))
    return out


def _is_float_model(model: onnx.ModelProto) -> bool:
    has_qdq = any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in model.graph.node)
    return not has_qdq and any(t.data_type == onnx.TensorProto.FLOAT for t in model.graph.initializer)
