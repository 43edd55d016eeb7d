"""Write a model as accelerator/CPU sub-models plus a manifest that wires them in order.

Sub-models are cut straight from the analysed node groups rather than with
``onnx.utils.Extractor``: the extractor walks only explicit node inputs, so it drops the
producers of tensors that If/Loop bodies read from the outer scope. Each piece is checked
with the onnx checker before anything is written.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import onnx

from edgecore.errors import ModelError
from edgecore.partitions import MANIFEST_FORMAT, MANIFEST_NAME
from targets.analysis import Analysis, Partition
from targets.graph import node_inputs

__all__ = ["write_partitions"]


def write_partitions(model: onnx.ModelProto, analysis: Analysis, out_dir: Path) -> Path:
    """Split ``model`` as ``analysis`` says; return the manifest path. Nothing is written on error.

    The pieces are cut from the graph the analysis saw (``analysis.model``: ``model`` after
    onnxruntime's basic optimizations), so node indices match.
    """
    if not analysis.partitions:
        raise ModelError(f"cannot partition for {analysis.target}: {analysis.reason}")
    prepared = analysis.model
    pieces = [(p, _piece(prepared, p)) for p in analysis.partitions]  # build all before writing any
    out_dir.mkdir(parents=True, exist_ok=True)
    entries = []
    for partition, piece in pieces:
        name = f"{partition.index:02d}-{partition.provider}.onnx"
        data = piece.SerializeToString()
        (out_dir / name).write_bytes(data)
        entries.append({
            "file": name,
            "provider": partition.provider,
            "accelerator": partition.accelerator,
            "nodes": len(partition.nodes),
            "inputs": list(partition.inputs),
            "outputs": list(partition.outputs),
            "sha256": hashlib.sha256(data).hexdigest(),
        })
    initializers = {t.name for t in prepared.graph.initializer}
    manifest = {
        "format": MANIFEST_FORMAT,
        "target": analysis.target,
        "inputs": [i.name for i in prepared.graph.input if i.name not in initializers],
        "outputs": [o.name for o in prepared.graph.output],
        "pieces": entries,
        "merges": list(analysis.merges),
    }
    path = out_dir / MANIFEST_NAME
    path.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return path


def _value_infos(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    graph = model.graph
    return {v.name: v for v in list(graph.value_info) + list(graph.input) + list(graph.output)}


def _piece(model: onnx.ModelProto, partition: Partition) -> onnx.ModelProto:
    graph = model.graph
    infos = _value_infos(model)
    nodes = [graph.node[i] for i in partition.nodes]
    used = {name for node in nodes for name in node_inputs(node)}
    missing = [n for n in partition.inputs + partition.outputs if n not in infos]
    if missing:
        raise ModelError(
            f"cannot partition: tensor {missing[0]!r} has no inferred type; fix shapes with --static-shape"
        )
    sub = onnx.helper.make_graph(
        nodes,
        f"{graph.name}_part{partition.index}",
        [infos[n] for n in partition.inputs],
        [infos[n] for n in partition.outputs],
        [t for t in graph.initializer if t.name in used],
    )
    piece = onnx.helper.make_model(
        sub, opset_imports=list(model.opset_import), ir_version=model.ir_version, producer_name="edgectl partition"
    )
    piece.functions.extend(model.functions)
    try:
        onnx.checker.check_model(piece)
    except onnx.checker.ValidationError as exc:
        raise ModelError(f"partition {partition.index} fails the ONNX checker: {str(exc).splitlines()[0]}") from exc
    return piece
