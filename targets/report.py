"""Self-contained HTML report: the graph as inline SVG, coloured by execution provider."""

from __future__ import annotations

import html
from pathlib import Path

import onnx

from targets.analysis import Analysis
from targets.graph import node_inputs

__all__ = ["write_html_report"]

COLOURS = ["#4caf50", "#2196f3", "#9c27b0", "#ff9800", "#795548"]
CPU_COLOUR = "#9e9e9e"
BOX_W, BOX_H, GAP_X, GAP_Y = 150, 34, 40, 24
_STYLE = ("body{font-family:sans-serif;margin:1em}table{border-collapse:collapse}"
          "td,th{border:1px solid #ccc;padding:2px 6px;font-size:12px}")
_PARTITION_HEAD = ("<tr><th>#</th><th>provider</th><th>nodes</th><th>est. FLOPs</th>"
                   "<th>inputs</th><th>outputs</th></tr>")
_NODE_HEAD = "<tr><th>#</th><th>name</th><th>op</th><th>provider</th><th>why not earlier providers</th></tr>"


def _levels(model: onnx.ModelProto) -> list[int]:
    """Longest-path depth of each node: the column it is drawn in."""
    producer = {o: i for i, n in enumerate(model.graph.node) for o in n.output}
    depth: list[int] = []
    for node in model.graph.node:  # graph.node is topologically sorted in valid ONNX
        parents = [depth[producer[n]] for n in node_inputs(node) if n in producer and producer[n] < len(depth)]
        depth.append(max(parents, default=-1) + 1)
    return depth


def _svg(model: onnx.ModelProto, analysis: Analysis, colours: dict[str, str]) -> str:
    depth = _levels(model)
    rows: dict[int, int] = {}
    pos = []
    for d in depth:
        pos.append((d * (BOX_W + GAP_X) + 10, rows.get(d, 0) * (BOX_H + GAP_Y) + 10))
        rows[d] = rows.get(d, 0) + 1
    part_of = {i: p.index for p in analysis.runtime_partitions for i in p.nodes}
    producer = {o: i for i, n in enumerate(model.graph.node) for o in n.output}
    width = (max(depth, default=0) + 1) * (BOX_W + GAP_X) + 20
    height = max(rows.values(), default=1) * (BOX_H + GAP_Y) + 20
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-size="11">']
    for i, node in enumerate(model.graph.node):
        for name in node_inputs(node):
            if name in producer:
                (x1, y1), (x2, y2) = pos[producer[name]], pos[i]
                parts.append(f'<line x1="{x1 + BOX_W}" y1="{y1 + BOX_H / 2}" x2="{x2}" y2="{y2 + BOX_H / 2}" '
                             'stroke="#bbb"/>')
    for i, assignment in enumerate(analysis.nodes[: len(depth)]):  # bodies are listed in the table only
        x, y = pos[i]
        tip = html.escape(f"{assignment.name} -> {assignment.provider}; " + "; ".join(assignment.reasons))
        label = html.escape(f"P{part_of.get(i, '?')} {assignment.op_type}"[:22])
        parts.append(f'<g><title>{tip}</title><rect x="{x}" y="{y}" width="{BOX_W}" height="{BOX_H}" rx="5" '
                     f'fill="{colours[assignment.provider]}"/><text x="{x + 6}" y="{y + 21}" fill="white">'
                     f"{label}</text></g>")
    parts.append("</svg>")
    return "".join(parts)


def write_html_report(model: onnx.ModelProto, analysis: Analysis, path: Path) -> None:
    """Write one HTML file with no external resources."""
    model = analysis.model  # the graph the analysis saw, after onnxruntime's basic optimizations
    providers = list(dict.fromkeys(n.provider for n in analysis.nodes))
    colours = {p: (CPU_COLOUR if p == "CPUExecutionProvider" else COLOURS[k % len(COLOURS)])
               for k, p in enumerate(providers)}
    legend = " ".join(f'<span style="background:{c};color:white;padding:2px 6px">{html.escape(p)}</span>'
                      for p, c in colours.items())
    parts_rows = "".join(
        f"<tr><td>P{p.index} {html.escape(p.graph)}</td><td>{html.escape(p.provider)}</td><td>{len(p.nodes)}</td>"
        f"<td>{'unknown' if p.flops is None else f'{p.flops:,}'}</td>"
        f"<td>{html.escape(', '.join(p.inputs))}</td><td>{html.escape(', '.join(p.outputs))}</td></tr>"
        for p in analysis.runtime_partitions
    )
    node_rows = "".join(
        f"<tr><td>{n.index}</td><td>{html.escape(n.graph)}: {html.escape(n.name)}</td><td>{html.escape(n.op_type)}</td>"
        f"<td>{html.escape(n.provider)}</td><td>{html.escape('; '.join(n.reasons))}</td></tr>"
        for n in analysis.nodes
    )
    items = "".join(f"<li>{html.escape(a)}</li>" for a in analysis.advice + analysis.merges)
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>edgectl inspect: {html.escape(analysis.target)}</title>
<style>{_STYLE}</style>
</head><body><h1>{html.escape(analysis.target)}: {analysis.verdict}</h1><p>{html.escape(analysis.reason)}</p>
<ul>{items}</ul><p>{legend}</p><div style="overflow:auto">{_svg(model, analysis, colours)}</div>
<h2>Partitions onnxruntime will make</h2><p>runtime: {html.escape(analysis.runtime.reason)}; policy
({len(analysis.partitions)} piece(s) for <code>edgectl partition</code>): {html.escape(analysis.policy.verdict)}
- {html.escape(analysis.policy.reason)}</p><table>{_PARTITION_HEAD}{parts_rows}</table>
<h2>Nodes</h2><table>{_NODE_HEAD}{node_rows}</table>
</body></html>
"""
    path.write_text(page, encoding="utf-8")
