"""Target commands: `targets list|show`, `inspect` (what runs where) and `partition`."""

from __future__ import annotations

from pathlib import Path

import onnx
import typer
from rich.progress import Progress

import targets
from edgecore.errors import ConfigError, ModelError
from edgecore.modelcheck import check_model, load_model_checked
from edgectl.cli.app import app
from edgectl.cli.output import console, print_json, print_table
from targets.partitioner import write_partitions
from targets.prepare import runtime_graph
from targets.report import write_html_report
from targets.shapes import dims_text, dynamic_inputs, fix_input_shapes, parse_static_shapes, static_shape_hint

targets_app = typer.Typer(help="List and show target profiles (configs/targets/*.yaml and your own).",
                          no_args_is_help=True)
app.add_typer(targets_app, name="targets")

STATIC_SHAPE_HELP = "Fix an input shape before analysis, e.g. input=1x3x224x224 (repeatable)."


@targets_app.command("list")
def list_targets(json_out: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
    """List every target profile found."""
    profiles = targets.list_profiles()
    if json_out:
        print_json([p.to_dict() for p in profiles])
        return
    print_table("Target profiles", ["name", "providers", "precision", "static shapes", "max partitions"], [
        (p.name, " > ".join(ep.name.replace("ExecutionProvider", "") for ep in p.execution_providers)
         or f"none ({p.unsupported.runtime if p.unsupported else '?'})", p.precision.format,
         "required" if p.shape.static_required else "optional", p.partition.max_partitions if p.execution_providers else "-")
        for p in profiles
    ])


@targets_app.command("show")
def show_target(
    name: str = typer.Argument(..., help="Profile name, e.g. nnapi."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
) -> None:
    """Show one target profile in full."""
    profile = targets.load_profile(name)
    if json_out:
        print_json(profile.to_dict())
        return
    console.print(f"[bold]{profile.name}[/bold]: {profile.description}\n  file: {profile.source_file}")
    if profile.unsupported is not None:
        _print_unsupported(profile)
        return
    print_table("Execution providers (priority order)", ["provider", "runtime", "versions", "options", "op support"], [
        (ep.name, ep.runtime, ep.versions, " ".join(f"{k}={v}" for k, v in ep.options.items()),
         ep.op_support.source + (f" {ep.op_support.table}:{ep.op_support.table_version}" if ep.op_support.table else ""))
        for ep in profile.execution_providers
    ])
    p = profile
    console.print(f"precision: {p.precision.format} ({p.precision.activations} activations, {p.precision.weights} "
                  f"weights) {p.precision.notes}\nshapes: static {'required' if p.shape.static_required else 'optional'}"
                  f"\npartitions: at most {p.partition.max_partitions}, at least {p.partition.min_partition_nodes} nodes")
    for note in p.notes:
        console.print(f"note: {note}")


def _print_unsupported(profile: targets.TargetProfile) -> None:
    assert profile.unsupported is not None
    console.print(f"{profile.name}: NO - {profile.unsupported.reason}", markup=False, style="bold")
    console.print(f"runtime: {profile.unsupported.runtime}\nconversion path:", markup=False)
    for k, step in enumerate(profile.unsupported.conversion, 1):
        console.print(f"  {k}. {step}", markup=False)
    for note in profile.notes:
        console.print(f"note: {note}", markup=False)


def _load(model_path: Path, static_shape: list[str], profile: targets.TargetProfile | None) -> onnx.ModelProto:
    model = load_model_checked(model_path)
    check_model(model)
    shapes = dict(profile.shape.default_static_shapes) if profile else {}
    shapes = {k: v for k, v in shapes.items() if k in {i.name for i in model.graph.input}}
    asked = parse_static_shapes(static_shape)
    shapes.update(asked)
    if not shapes:
        return model
    fixed = fix_input_shapes(model, shapes)
    refusal = runtime_graph(fixed).refusal if asked else None
    if refusal is not None and runtime_graph(model).refusal is None:
        shown = " ".join(f"{n}={'x'.join(map(str, d))}" for n, d in asked.items())
        raise ConfigError(f"--static-shape {shown}: onnxruntime cannot load the model at these shapes ({refusal}); "
                          "it loads with its own: give shapes the model was exported for")
    return fixed


@app.command()
def inspect(
    model_path: Path = typer.Argument(..., metavar="MODEL", help="ONNX model to analyse."),
    target: str = typer.Option(..., "--target", "-t", help="Profile name, or 'all' for a summary of every target."),
    json_out: bool = typer.Option(False, "--json", help="Print the analysis as JSON."),
    html_path: Path | None = typer.Option(None, "--html", help="Also write a self-contained HTML report here."),
    static_shape: list[str] = typer.Option([], "--static-shape", help=STATIC_SHAPE_HELP),
) -> None:
    """Show what will run where on a target: per node, partitions, verdict and advice."""
    if html_path is not None and target == "all":
        raise ConfigError("--html draws one target: give --target NAME, not 'all'")
    profiles = targets.list_profiles() if target == "all" else [targets.load_profile(target)]
    model = _load(model_path, static_shape, profiles[0] if len(profiles) == 1 else None)
    with Progress(transient=True, console=console) as progress:
        task = progress.add_task("analysing", total=len(profiles))
        analyses = []
        for profile in profiles:
            analyses.append(targets.analyse(model, profile))
            progress.advance(task)
    if html_path is not None:
        write_html_report(model, analyses[0], html_path)
    if json_out:
        print_json([a.to_dict() for a in analyses] if target == "all" else analyses[0].to_dict())
    elif target == "all":
        print_table(f"{model_path.name} on every target (runtime: deployed whole; policy: edgectl partition)",
                    ["target", "runtime (acc. partitions)", "nodes on acc.", "FLOPs on acc.", "policy", "reason"], [
            (a.target, f"{a.verdict} ({a.accelerator_partitions})", f"{a.accelerator_node_share:.0%}",
             _share(a.accelerator_flops_share), f"{a.policy.verdict} ({a.policy.accelerator_partitions})", a.reason)
            for a in analyses
        ])
    else:
        _print_analysis(analyses[0])


def _share(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.0%}"


def _print_analysis(a: targets.Analysis) -> None:
    if a.nodes:
        print_table(f"Nodes ({len(a.nodes)})", ["#", "graph", "node", "op", "provider", "policy", "why not earlier providers"], [
            (n.index, n.graph, n.name, n.op_type, n.provider, "" if n.planned == n.provider else n.planned,
             "; ".join(n.reasons)) for n in a.nodes
        ])
        print_table("Partitions onnxruntime will make (deployed whole)", ["#", "graph", "provider", "nodes", "est. FLOPs",
                                                                            "inputs", "outputs"], [
            (p.index, p.graph, p.provider, len(p.nodes), "unknown" if p.flops is None else f"{p.flops:,}",
             ", ".join(p.inputs), ", ".join(p.outputs)) for p in a.runtime_partitions
        ])
        print_table("Pieces the profile's policy recommends (edgectl partition)", ["#", "provider", "nodes"], [
            (p.index, p.provider, len(p.nodes)) for p in a.partitions
        ])
    console.print(f"graph: {a.graph_note}", markup=False)
    for source in a.sources.items():
        console.print("op support: {} from {}".format(*source), markup=False)
    for merge in a.merges:
        console.print(f"merged: {merge}", markup=False)
    console.print(f"{a.target}: {a.verdict} - {a.reason}", markup=False, style="bold")
    if a.nodes:
        console.print(f"policy: {a.policy.verdict} - {a.policy.reason}", markup=False)
    for advice in a.advice:
        console.print(f"advice: {advice}", markup=False)


@app.command()
def partition(
    model_path: Path = typer.Argument(..., metavar="MODEL", help="ONNX model to split."),
    target: str = typer.Option(..., "--target", "-t", help="Profile name, e.g. nnapi."),
    out_dir: Path = typer.Option(..., "--output", "-o", help="Directory for the pieces and partitions.json."),
    min_partition_nodes: int | None = typer.Option(
        None, "--min-partition-nodes", min=1, help="Accelerator partitions smaller than this go to the next "
        "provider (default: the profile's)."),
    static_shape: list[str] = typer.Option([], "--static-shape", help=STATIC_SHAPE_HELP),
) -> None:
    """Split a model into accelerator and CPU sub-models plus a manifest that runs them in order."""
    profile = targets.load_profile(target)
    if profile.unsupported is not None:
        raise ConfigError(f"cannot partition for {profile.name}: {profile.unsupported.reason}")
    model = _load(model_path, static_shape, profile)
    dynamic = dynamic_inputs(model)
    refusal = runtime_graph(model).refusal
    if refusal is not None:
        raise ModelError(f"cannot partition {model_path.name}: onnxruntime cannot load it ({refusal}), so no piece "
                         "would load either; fix the model first (`edgectl inspect` shows the rest)")
    if dynamic and profile.shape.static_required:
        raise ModelError(f"cannot partition for {profile.name} (static shapes only): input {dynamic[0].name!r} is "
                         f"{dims_text(dynamic[0])}; give {static_shape_hint(model)}")
    analysis = targets.analyse(model, profile, min_partition_nodes=min_partition_nodes)
    manifest = write_partitions(model, analysis, out_dir)
    for merge in analysis.merges:
        console.print(f"merged: {merge}", markup=False)
    print_table(f"{len(analysis.partitions)} piece(s) in {out_dir}", ["#", "provider", "nodes"], [
        (p.index, p.provider, len(p.nodes)) for p in analysis.partitions
    ])
    console.print(f"manifest: {manifest}")
