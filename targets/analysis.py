"""What runs where: per-node provider, partitions, accelerator share, verdict and advice.

Two views, reported apart:

- **runtime**: what onnxruntime will do with the model deployed whole: the graph after its
  basic optimizations (``targets.prepare``), every node placed on the first provider that takes
  it, partitions formed in the main graph and inside every If/Loop/Scan body it does not hand
  to an accelerator whole. The top-level ``verdict``, ``reason`` and ``accelerator_*`` figures
  are this view (ORT's own usability thresholds).
- **policy**: what the profile recommends: accelerator partitions smaller than
  ``min_partition_nodes`` moved on, at most ``max_partitions``; these are the pieces
  ``edgectl partition`` writes (``partitions``). Bodies run with their control-flow node there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import onnx

from targets.flops import estimate_flops, share
from targets.graph import Group, Scope, boundary, group_nodes, ort_groups, scopes
from targets.prepare import prepare_model, runtime_graph
from targets.profile import TargetProfile
from targets.shapes import dynamic_inputs, static_shape_hint
from targets.support import Support, decide_support, flat_nodes

__all__ = ["Analysis", "Figures", "NodeAssignment", "Partition", "analyse", "prepare_model"]


@dataclass(frozen=True)
class NodeAssignment:
    """Where one node runs (runtime view), where the policy puts it, and why not on earlier providers."""

    index: int  # flat index: main graph first, then bodies (targets.graph.scopes)
    name: str
    op_type: str
    domain: str
    provider: str
    accelerator: bool
    flops: int | None  # None: a dim it depends on is unknown
    reasons: tuple[str, ...]  # "Provider: why not", for each higher-priority provider
    graph: str = "main"  # "main" or the body's path, e.g. "if/then_branch"
    planned: str = ""  # provider under the profile's policy (what `edgectl partition` writes)


@dataclass(frozen=True)
class Partition:
    """A run of consecutive nodes of one graph on one provider, with the tensors crossing its border."""

    index: int
    provider: str
    accelerator: bool
    nodes: tuple[int, ...]  # flat indices (for the main graph, also indices into graph.node)
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    flops: int | None
    graph: str = "main"


@dataclass(frozen=True)
class Figures:
    """One view's numbers and the verdict they give."""

    accelerator_partitions: int
    accelerator_nodes: int
    nodes: int
    flops_share: float | None  # None: unknown (a dim some node depends on is not known)
    verdict: str  # YES, MAYBE or NO
    reason: str

    @property
    def node_share(self) -> float:
        """Share of nodes (bodies included) on an accelerator."""
        return self.accelerator_nodes / max(self.nodes, 1)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; an unknown FLOPs share is null."""
        return {"verdict": self.verdict, "reason": self.reason, "accelerator_partitions": self.accelerator_partitions,
                "accelerator_nodes": self.accelerator_nodes, "nodes": self.nodes,
                "accelerator_node_share": round(self.node_share, 4),
                "accelerator_flops_share": None if self.flops_share is None else round(self.flops_share, 4)}


@dataclass(frozen=True)
class Analysis:
    """The answer to "what will run where on this target, and is it worth it"."""

    target: str
    nodes: tuple[NodeAssignment, ...]
    partitions: tuple[Partition, ...]  # the policy's pieces of the main graph
    runtime_partitions: tuple[Partition, ...]  # as onnxruntime forms them, bodies included
    runtime: Figures
    policy: Figures
    advice: tuple[str, ...]
    merges: tuple[str, ...]
    sources: dict[str, str]
    graph_note: str = ""
    model: onnx.ModelProto = field(default_factory=onnx.ModelProto, repr=False, compare=False)
    refusal: str | None = None  # why onnxruntime cannot load the model: then nothing runs, whatever the ops

    @property
    def loads(self) -> bool:
        """True when onnxruntime loads the model (every ONNX target runs it through onnxruntime)."""
        return self.refusal is None

    @property
    def verdict(self) -> str:
        """The runtime view's verdict."""
        return self.runtime.verdict

    @property
    def reason(self) -> str:
        """Why the runtime view gives its verdict."""
        return self.runtime.reason

    @property
    def accelerator_partitions(self) -> int:
        """Accelerator partitions onnxruntime will make, bodies included."""
        return self.runtime.accelerator_partitions

    @property
    def accelerator_node_share(self) -> float:
        """Share of nodes onnxruntime will run on an accelerator."""
        return self.runtime.node_share

    @property
    def accelerator_flops_share(self) -> float | None:
        """Share of estimated FLOPs on an accelerator; None when unknown."""
        return self.runtime.flops_share

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, stable keys (used by --json, packaging and the quantize helper)."""
        return {
            "target": self.target,
            **self.runtime.to_dict(),
            "advice": list(self.advice),
            "graph": self.graph_note,
            "sources": dict(self.sources),
            "merges": list(self.merges),
            "runtime": {**self.runtime.to_dict(), "partitions": [self._part(p) for p in self.runtime_partitions]},
            "policy": {**self.policy.to_dict(), "partitions": [self._part(p) for p in self.partitions]},
            "partitions": [self._part(p) for p in self.partitions],
            "nodes": [{**vars(n), "reasons": list(n.reasons)} for n in self.nodes],
        }

    def _part(self, p: Partition) -> dict[str, Any]:
        return {**vars(p), "nodes": [self.nodes[i].name for i in p.nodes], "inputs": list(p.inputs),
                "outputs": list(p.outputs)}


def analyse(
    model: onnx.ModelProto,
    profile: TargetProfile,
    *,
    min_partition_nodes: int | None = None,
    max_partitions: int | None = None,
) -> Analysis:
    """Analyse ``model`` for ``profile``; policy limits default to the profile's."""
    prepared = runtime_graph(model)
    if profile.unsupported is not None:
        return _not_runnable(profile, prepared.model, prepared.note)
    m = prepared.model
    all_scopes = scopes(m.graph)
    nodes = flat_nodes(all_scopes)
    supports = [decide_support(m, all_scopes, ep, profile) for ep in profile.execution_providers]
    accel = [ep.accelerator for ep in profile.execution_providers]
    runtime = _runtime_choice(all_scopes, supports, accel)
    flops = estimate_flops(all_scopes)
    top = len(m.graph.node)
    planned = runtime[:top]
    limits = (min_partition_nodes or profile.partition.min_partition_nodes,
              max_partitions or profile.partition.max_partitions)
    merges = _apply_fragmentation_policy(m, supports, accel, planned, flops, *limits)
    planned = _bodies_follow_owners(all_scopes, planned, accel, runtime)
    assignments = tuple(_assignment(nodes, all_scopes, supports, accel, runtime, planned, flops, i)
                        for i in range(len(nodes)))
    runtime_parts, runtime_count = _runtime_partitions(all_scopes, supports, accel, runtime, flops)
    pieces = tuple(_partition(m.graph, "main", 0, supports, accel, g, flops, k)
                   for k, g in enumerate(group_nodes(m.graph, planned[:top])))
    policy_count = len([g for g in group_nodes(m.graph, [accel[c] for c in planned[:top]]) if g.label])
    runtime_fig = _figures(profile, supports, runtime, accel, runtime_count, flops)
    policy_fig = _figures(profile, supports, planned, accel, policy_count, flops)
    advice = _advice(m, profile, assignments, runtime_fig, policy_fig, merges)
    if prepared.refusal is not None:  # op support cannot help a model that does not load at all
        import onnxruntime as ort

        why = f"onnxruntime {ort.__version__} cannot load the model: {prepared.refusal}"
        runtime_fig, policy_fig = _with(runtime_fig, "NO", why), _with(policy_fig, "NO", why)
        advice = ["fix the model (or the --static-shape given) so that onnxruntime loads it; the per-node figures "
                  "are what it would do if it did", *advice]
    return Analysis(
        target=profile.name, nodes=assignments, partitions=pieces, runtime_partitions=runtime_parts,
        runtime=runtime_fig, policy=policy_fig, advice=tuple(advice), merges=tuple(merges),
        sources={s.provider: s.source for s in supports}, graph_note=prepared.note, model=m, refusal=prepared.refusal,
    )


def _not_runnable(profile: TargetProfile, model: onnx.ModelProto, note: str) -> Analysis:
    assert profile.unsupported is not None
    why = profile.unsupported
    figures = Figures(0, 0, len(model.graph.node), None, "NO", why.reason)
    advice = (f"conversion path ({why.runtime}):", *(f"{k}. {step}" for k, step in enumerate(why.conversion, 1)))
    return Analysis(target=profile.name, nodes=(), partitions=(), runtime_partitions=(), runtime=figures,
                    policy=figures, advice=advice, merges=(), sources={profile.name: f"not an ONNX target: {why.runtime}"},
                    graph_note=note, model=model)


def _ep(group: Group) -> int:
    """The provider index a group of provider choices is labelled with."""
    assert isinstance(group.label, int)
    return group.label


def _first_supporting(supports: list[Support], node: int, after: int = -1) -> int:
    """Index of the first provider after ``after`` that takes the node; the last (CPU) otherwise."""
    for k in range(after + 1, len(supports)):
        if supports[k].reasons[node] is None:
            return k
    return len(supports) - 1


def _runtime_choice(all_scopes: list[Scope], supports: list[Support], accel: list[bool]) -> list[int]:
    """First supporting provider per node; a body given to an accelerator whole goes with its owner."""
    choice: list[int] = []
    for scope in all_scopes:
        for _ in scope.graph.node:
            owner = scope.owner
            if owner is not None and accel[choice[owner]]:
                choice.append(choice[owner])
            else:
                choice.append(_first_supporting(supports, len(choice)))
    return choice


def _bodies_follow_owners(all_scopes: list[Scope], top: list[int], accel: list[bool], runtime: list[int]) -> list[int]:
    """Under the policy a body runs in its owner's piece: on the owner's accelerator, else the CPU."""
    planned = list(top)
    cpu = len(accel) - 1
    for scope in all_scopes[1:]:
        owner = planned[scope.owner] if scope.owner is not None else cpu
        planned += [owner if accel[owner] else cpu for _ in scope.graph.node]
    assert len(planned) == len(runtime)
    return planned


def _runtime_partitions(
    all_scopes: list[Scope], supports: list[Support], accel: list[bool], choice: list[int], flops: list[int | None]
) -> tuple[tuple[Partition, ...], int]:
    """Each accelerator's groups per graph as onnxruntime forms them (and their count), then the CPU's nodes."""
    found: list[tuple[Scope, int, Group]] = []
    count = 0
    for scope in all_scopes:
        if scope.owner is not None and accel[choice[scope.owner]]:
            continue  # inside its owner's accelerator partition
        labels = [choice[scope.start + i] for i in range(len(scope.graph.node))]
        for k in [k for k, is_accel in enumerate(accel) if is_accel]:
            groups = ort_groups(scope.graph, [label == k for label in labels])
            count += len(groups)
            found += [(scope, k, Group(k, g)) for g in groups]
        rest = tuple(i for i, label in enumerate(labels) if not accel[label])
        if rest:  # the CPU EP runs node by node: its nodes are listed together
            found.append((scope, len(accel) - 1, Group(len(accel) - 1, rest)))
    found.sort(key=lambda item: item[0].start + item[2].nodes[0])
    return tuple(_partition(scope.graph, scope.path, scope.start, supports, accel, group, flops, n)
                 for n, (scope, _, group) in enumerate(found)), count


def _apply_fragmentation_policy(
    model: onnx.ModelProto, supports: list[Support], accel: list[bool], choice: list[int],
    flops: list[int | None], min_nodes: int, max_parts: int,
) -> list[str]:
    """Demote too-small partitions, then the cheapest ones past the limit; say what moved and why."""
    merges: list[str] = []
    while True:
        small = [g for g in group_nodes(model.graph, choice) if accel[_ep(g)] and len(g.nodes) < min_nodes]
        if small:
            for g in small:
                for i in g.nodes:
                    choice[i] = _first_supporting(supports, i, after=_ep(g))
                merges.append(_merge_note(model, supports, g, choice, supports[_ep(g)].provider,
                                          f"fewer than {min_nodes} nodes"))
            continue
        device = [g for g in group_nodes(model.graph, [accel[c] for c in choice]) if g.label]
        if len(device) <= max_parts:
            return merges
        # unknown FLOPs count as 0 here: the smallest group by nodes goes first among them
        cheapest = min(device, key=lambda g: (sum(flops[i] or 0 for i in g.nodes), len(g.nodes)))
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
    nodes: list[onnx.NodeProto], all_scopes: list[Scope], supports: list[Support], accel: list[bool],
    choice: list[int], planned: list[int], flops: list[int | None], i: int,
) -> NodeAssignment:
    node = nodes[i]
    scope = next(s for s in reversed(all_scopes) if s.start <= i)
    reasons = tuple(f"{s.provider}: {s.reasons[i] or 'runs inside its control-flow node'}"
                    for s in supports[: choice[i]])
    if supports[choice[i]].reasons[i] is not None and not accel[choice[i]]:  # not even the CPU fallback takes it
        reasons += (f"{supports[choice[i]].provider}: {supports[choice[i]].reasons[i]}",)
    return NodeAssignment(i, node.name, node.op_type, node.domain or "ai.onnx", supports[choice[i]].provider,
                          accel[choice[i]], flops[i], reasons, scope.path, supports[planned[i]].provider)


def _partition(
    graph: onnx.GraphProto, path: str, start: int, supports: list[Support], accel: list[bool], group: Group,
    flops: list[int | None], k: int,
) -> Partition:
    inputs, outputs = boundary(graph, group.nodes)
    counts = [flops[start + i] for i in group.nodes]
    total = None if any(c is None for c in counts) else sum(c for c in counts if c is not None)
    return Partition(k, supports[_ep(group)].provider, accel[_ep(group)], tuple(start + i for i in group.nodes),
                     tuple(inputs), tuple(outputs), total, path)


def _figures(
    profile: TargetProfile, supports: list[Support], choice: list[int], accel: list[bool], parts: int,
    flops: list[int | None],
) -> Figures:
    """ORT's usability thresholds: one partition over 75% of nodes is good, more than two is poor."""
    on_accel = [accel[c] for c in choice]
    flops_share = share(flops, on_accel)
    figures = Figures(parts, sum(on_accel), len(choice), flops_share, "", "")
    cpu = supports[-1]
    broken = [i for i, c in enumerate(choice) if not accel[c] and cpu.reasons[i] is not None]
    if broken:
        return _with(figures, "NO", f"node {broken[0]} cannot run at all: {cpu.reasons[broken[0]]}")
    if not profile.accelerator_providers:
        return _with(figures, "YES", f"all {len(choice)} nodes run on {cpu.provider}")
    flops_text = "FLOPs unknown" if flops_share is None else f"{flops_share:.0%} of FLOPs"
    pct = f"{figures.node_share:.0%} of nodes, {flops_text}"
    if parts == 0:
        return _with(figures, "NO", "no node runs on the accelerator")
    if parts == 1 and figures.node_share > 0.75:
        return _with(figures, "YES", f"1 accelerator partition: {pct}")
    if (parts == 1 and figures.node_share > 0.5) or (parts == 2 and figures.node_share > 0.75):
        return _with(figures, "MAYBE", f"{parts} accelerator partition(s): {pct}")
    return _with(figures, "NO", f"{parts} accelerator partition(s): only {pct}")


def _with(figures: Figures, verdict: str, reason: str) -> Figures:
    return Figures(figures.accelerator_partitions, figures.accelerator_nodes, figures.nodes, figures.flops_share,
                   verdict, reason)


def _advice(
    model: onnx.ModelProto, profile: TargetProfile, nodes: tuple[NodeAssignment, ...], runtime: Figures,
    policy: Figures, merges: list[str],
) -> list[str]:
    advice: list[str] = []
    reasons = [r for n in nodes for r in n.reasons]
    dynamic_inside = any("dynamic shape" in r for r in reasons)
    if dynamic_inputs(model) and (dynamic_inside or profile.shape.static_required):
        advice.append(f"fix input shapes with `{static_shape_hint(model)}` (batch shown as 1; replace any letters "
                      "with the sizes you deploy)")
    elif dynamic_inside:
        advice.append("inputs are static but shapes computed inside the graph (Shape->Reshape) stay dynamic: "
                      "constant-fold them (e.g. onnxsim) so the accelerator sees fixed shapes")
    if runtime.flops_share is None and dynamic_inputs(model):
        advice.append("FLOPs shares are unknown until the input shapes are fixed (--static-shape)")
    if profile.precision.format not in ("fp32",) and _is_float_model(model):
        advice.append(f"quantize for {profile.name}: {profile.precision.format} "
                      f"({profile.precision.activations} activations, {profile.precision.weights} weights)")
    # ops refused for what they are, not for a dynamic shape the advice above already fixes
    blocked = sorted({f"{n.domain}:{n.op_type}" for n in nodes if not n.accelerator and n.reasons
                      and not all("dynamic shape" in r for r in n.reasons)})
    if blocked and profile.accelerator_providers:
        advice.append(f"these ops stay on the CPU: {', '.join(blocked[:8])}; replace them or accept the fallback")
    if merges:
        advice.append(f"deployed whole, onnxruntime makes {runtime.accelerator_partitions} accelerator partition(s) "
                      f"({runtime.verdict}); the profile's policy recommends {policy.accelerator_partitions} "
                      f"({policy.verdict}): `edgectl partition` writes that plan")
    if runtime.verdict == "NO" and policy.verdict == "NO" and profile.accelerator_providers:
        advice.append("this target gains little: consider a CPU profile (cpu-x86 / cpu-arm)")
    return advice


def _is_float_model(model: onnx.ModelProto) -> bool:
    has_qdq = any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in model.graph.node)
    return not has_qdq and any(t.data_type == onnx.TensorProto.FLOAT for t in model.graph.initializer)
