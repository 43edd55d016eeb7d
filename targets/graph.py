"""Graph structure for partitioning: dependencies (including subgraph outer-scope reads) and grouping."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import onnx

__all__ = ["Group", "Scope", "boundary", "group_nodes", "node_inputs", "ort_groups", "scopes"]


@dataclass(frozen=True)
class Group:
    """Consecutive nodes (indices into graph.node) with one label, in execution order."""

    label: Hashable
    nodes: tuple[int, ...]


@dataclass(frozen=True)
class Scope:
    """One graph execution providers partition: the main graph or an If/Loop/Scan body.

    Nodes of every scope form one flat list (main graph first, then bodies breadth-first);
    ``start`` is the flat index of ``graph.node[0]`` and ``owner`` that of the control-flow node
    whose body this is (None for the main graph).
    """

    path: str
    graph: onnx.GraphProto
    owner: int | None
    start: int
    parent: int | None  # index of the enclosing scope in the scopes list


def scopes(graph: onnx.GraphProto) -> list[Scope]:
    """The main graph and every nested body, breadth-first, with flat node offsets."""
    found = [Scope("main", graph, None, 0, None)]
    total = len(graph.node)
    k = 0
    while k < len(found):
        scope = found[k]
        for i, node in enumerate(scope.graph.node):
            for attr in node.attribute:
                for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                    path = f"{node.name or node.op_type}/{attr.name}"
                    found.append(Scope(path if scope.owner is None else f"{scope.path}/{path}", sub,
                                       scope.start + i, total, k))
                    total += len(sub.node)
        k += 1
    return found


def _subgraph_reads(graph: onnx.GraphProto) -> set[str]:
    """Names a subgraph reads from its outer scope (used but not defined inside it)."""
    defined = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    used: set[str] = set()
    for node in graph.node:
        used.update(n for n in node.input if n)
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                used |= _subgraph_reads(sub)
        defined.update(node.output)
    used.update(o.name for o in graph.output)
    return used - defined


def node_inputs(node: onnx.NodeProto) -> list[str]:
    """Explicit inputs plus the outer-scope names its If/Loop/Scan bodies read."""
    names = [n for n in node.input if n]
    for attr in node.attribute:
        for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
            names += sorted(_subgraph_reads(sub) - set(names))
    return names


def group_nodes(graph: onnx.GraphProto, labels: Sequence[Hashable]) -> list[Group]:
    """Split the nodes into label-uniform groups that run in sequence.

    A topological order that keeps taking nodes of the current label while any is ready, so
    groups are intervals of one topological order and the pieces never depend on each other in
    a cycle. This is ORT's own greedy (partitioning_utils.cc) generalised to several labels.
    """
    producer = {out: i for i, node in enumerate(graph.node) for out in node.output if out}
    consumers: list[list[int]] = [[] for _ in graph.node]
    pending = [0] * len(graph.node)
    for i, node in enumerate(graph.node):
        deps = {producer[n] for n in node_inputs(node) if n in producer and producer[n] != i}
        pending[i] = len(deps)
        for d in deps:
            consumers[d].append(i)
    ready: dict[Hashable, list[int]] = {}
    for i, count in enumerate(pending):
        if count == 0:
            heapq.heappush(ready.setdefault(labels[i], []), i)
    groups: list[Group] = []
    current: list[int] = []
    label: Hashable = None
    while any(ready.values()):
        if not ready.get(label):
            if current:
                groups.append(Group(label, tuple(current)))
            current = []
            label = min((heap[0], key) for key, heap in ready.items() if heap)[1]
        i = heapq.heappop(ready[label])
        current.append(i)
        for c in consumers[i]:
            pending[c] -= 1
            if pending[c] == 0:
                heapq.heappush(ready.setdefault(labels[c], []), c)
    if current:
        groups.append(Group(label, tuple(current)))
    return groups


def ort_groups(graph: onnx.GraphProto, supported: Sequence[bool]) -> list[tuple[int, ...]]:
    """The node groups one execution provider gets, as onnxruntime forms them.

    A port of ``CreateSupportedPartitionNodeGroups`` (onnxruntime partitioning_utils.cc, mirrored
    by its Python usability checker): walk ready nodes in order; a supported node joins the open
    group; an unsupported node that consumes the group's output waits for the next group, any
    other unsupported node is passed without closing it. A group closes when nothing is ready.
    """
    producer = {out: i for i, node in enumerate(graph.node) for out in node.output if out}
    consumers: list[set[int]] = [set() for _ in graph.node]
    in_degree = [0] * len(graph.node)
    for i, node in enumerate(graph.node):
        deps = {producer[n] for n in node_inputs(node) if n in producer and producer[n] != i}
        in_degree[i] = len(deps)
        for d in deps:
            consumers[d].add(i)
    ready = deque(i for i, count in enumerate(in_degree) if count == 0)
    later: deque[int] = deque()
    groups: list[tuple[int, ...]] = []
    group: list[int] = []
    border: set[int] = set()
    while ready or later:
        if not ready:
            if group:
                groups.append(tuple(group))
            group, border, ready, later = [], set(), later, deque()
            continue
        i = ready.popleft()
        if not supported[i] and i in border:
            later.append(i)
            continue
        if supported[i]:
            group.append(i)
            border.discard(i)
            border |= consumers[i]
        for c in sorted(consumers[i]):
            in_degree[c] -= 1
            if in_degree[c] == 0:
                ready.append(c)
    if group:
        groups.append(tuple(group))
    return groups


def boundary(graph: onnx.GraphProto, nodes: Sequence[int]) -> tuple[list[str], list[str]]:
    """(inputs, outputs) of a node group: tensors crossing into and out of it, initializers excluded."""
    inside = set(nodes)
    produced = {out for i in nodes for out in graph.node[i].output if out}
    initializers = {t.name for t in graph.initializer}
    inputs: list[str] = []
    for i in nodes:
        for name in node_inputs(graph.node[i]):
            if name not in produced and name not in initializers and name not in inputs:
                inputs.append(name)
    used_outside = {n for j, node in enumerate(graph.node) if j not in inside for n in node_inputs(node)}
    used_outside |= {o.name for o in graph.output}
    outputs = [out for i in nodes for out in graph.node[i].output if out and out in used_outside]
    return inputs, outputs
