"""``edge-agent probe``: what hardware and backends this device has, and how fast each runs a model."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import typer
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn
from rich.table import Table

from agent.catalog import absent_backends, candidate_backends, runtime_versions
from agent.cli.app import app
from agent.cli.golden_dir import read_golden_dir
from agent.hardware import Hardware, probe_hardware
from agent.hardware.runtimes import profile_report
from agent.selection import Decision, Selection, select_backend
from edgecore.compiled_cache import use_root
from edgecore.errors import UserError
from edgecore.feeds import model_inputs, parse_input_shapes, resolve_shapes, synthetic_feeds

Arrays = dict[str, np.ndarray]


@app.command()
def probe(
    root: Path = typer.Option(Path("/"), "--root", exists=True, file_okay=False,
                              help="Root directory to read the hardware from (a device image or test tree)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document instead of tables."),
    model: Path | None = typer.Option(None, "--model", exists=True, dir_okay=False,
                                      help="Also benchmark every candidate backend on this ONNX model."),
    budget: float = typer.Option(10.0, "--budget", min=0.1,
                                 help="Most seconds to spend timing the candidates of --model while they cannot be "
                                      "told apart (a clear difference takes 5 rounds)."),
    allow: list[str] | None = typer.Option(None, "--allow", help="Allowed execution provider or backend (repeat); default: all."),
    input_shape: list[str] = typer.Option([], "--input-shape",
                                          help="Shape of a dynamic input of --model, NAME=1x3x640x640 (repeatable)."),
    golden: Path | None = typer.Option(
        None, "--golden", exists=True, file_okay=False,
        help="Folder of real inputs for --model: one .npy (single-input model) or .npz (an array per input; a "
             "package's golden.npz also gives the expected outputs) per sample, stacked on the batch axis. Backends "
             "are checked for accuracy on them; without them, only where noise can stand for the input."),
) -> None:
    """Print the detected hardware, the available backends and, with --model, a benchmark table."""
    if golden is not None and (model is None or input_shape):
        raise UserError("--golden needs --model, and its samples give the shapes: leave out --input-shape")
    feeds, expected = _feeds(model, input_shape, golden) if model is not None else (None, None)
    hardware = probe_hardware(root)
    candidates = candidate_backends(hardware, allow)
    report: dict[str, Any] = {
        "hardware": hardware.to_dict(),
        "fingerprint": hardware.fingerprint(),
        "runtimes": runtime_versions(),
        "backends": [c.name for c in candidates],
        "absent": [a.to_dict() for a in absent_backends(hardware)],
        "profiles": profile_report(),
    }
    if model is not None:
        report["inputs"] = f"golden, from {golden}" if golden else "given shapes, synthetic" if feeds else "synthetic"
        report["selection"] = _benchmark(model, hardware, allow, budget, feeds, expected, quiet=as_json)
    if as_json:
        typer.echo(json.dumps(report, indent=2))
        return
    _print(report)


def _feeds(model: Path, input_shape: list[str], golden: Path | None) -> tuple[Arrays | None, Arrays | None]:
    """(inputs, expected outputs): the golden samples, or synthetic ones in the shapes given (None: the selector's own).

    Without golden samples a dynamic dim other than the batch without a shape is refused (never 1x1)."""
    specs = model_inputs(model)
    if golden is not None:
        return read_golden_dir(golden, specs)
    shapes = resolve_shapes(specs, parse_input_shapes(input_shape))
    return (synthetic_feeds(specs, shapes) if input_shape else None), None


def _benchmark(model: Path, hardware: Hardware, allow: list[str] | None, budget: float,
               feeds: Arrays | None, expected: Arrays | None, quiet: bool) -> dict[str, Any]:
    """Measure every candidate afresh (a throw-away cache: probe never reuses a decision), then load the chosen
    one again to show what its compiled-model cache saves."""
    with tempfile.TemporaryDirectory() as cache, Progress(
        SpinnerColumn(), TextColumn("{task.description}"), transient=True, disable=quiet
    ) as bar:
        task = bar.add_task(f"measuring {model.name}")
        use_root(Path(cache) / "compiled")
        try:
            selection = select_backend(
                model,
                hardware=hardware,
                allowed_providers=allow,
                golden=feeds,
                expected=expected,
                cache_dir=Path(cache),
                time_budget_s=budget,
                remeasure=True,
                progress=lambda text: bar.update(task, description=text),
            )
            bar.update(task, description=f"loading {selection.backend} again from its compiled-model cache")
            return {**selection.to_dict(), "compiled_cache": _cached_load(selection)}
        finally:
            use_root(None)


def _cached_load(selection: Selection) -> dict[str, Any]:
    """The chosen backend's first load (during the measurement) and a second one, through the cache."""
    chosen = next(f for f in selection.figures if f.chosen)
    first = (chosen.placement.load if chosen.placement else None) or {}
    with selection.open() as runner:
        again = runner.placement.load or {}
    return {"backend": selection.backend, "cache": again.get("cache", "off"), "first_load_ms": first.get("load_ms"),
            "cached_load_ms": again.get("load_ms") if again.get("cache") == "hit" else None}


def _print(report: dict[str, Any]) -> None:
    console = Console()
    hw = report["hardware"]
    table = Table(title=f"hardware ({hw['root']}, fingerprint {report['fingerprint']})", show_header=False)
    cpu = hw["cpu"]
    table.add_row("os", hw["os"])
    table.add_row("cpu", f"{cpu['model']} ({cpu['vendor']}, {cpu['arch']}, {cpu['cores']} cores)")
    table.add_row("features", ", ".join(cpu["features"]) or "-")
    table.add_row("memory", f"{hw['memory_bytes'] / 2**30:.1f} GiB")
    for acc in hw["accelerators"]:
        details = ", ".join(f"{k}={v}" for k, v in acc["details"].items())
        table.add_row(acc["kind"], f"{acc['name']} {details}".strip())
    for zone in hw["thermal"]:
        table.add_row(f"thermal {zone['zone']}", f"{zone['type']}: {zone['celsius']:.1f} °C")
    table.add_row("runtimes", ", ".join(f"{k} {v}" for k, v in report["runtimes"].items()) or "none")
    table.add_row("backends", ", ".join(report["backends"]) or "none")
    table.add_row("not here", "\n".join(f"{a['backend']}: {a['reason']}" for a in report["absent"]) or "-")
    if "inputs" in report:
        table.add_row("inputs", report["inputs"])
    console.print(table)
    _print_profiles(console, report["profiles"])
    if "selection" in report:
        _print_selection(console, report["selection"])


def _print_profiles(console: Console, profiles: dict[str, dict[str, Any]]) -> None:
    """Per target profile: can the runtimes installed here run it, and if not, what to install."""
    table = Table(title="target profiles: the runtimes installed here")
    for column in ("profile", "runtime", "what is missing", "install"):
        table.add_column(column, no_wrap=column in ("profile", "runtime"))
    for name, status in profiles.items():
        table.add_row(name, status["status"], "\n".join(status.get("problems", [])) or "-",
                      "\n".join(status.get("install", [])) or "-")
    console.print(table)


def _print_selection(console: Console, selection: dict[str, Any]) -> None:
    table = Table(title=f"{Path(selection['model']).name} ({selection['precision']}): chose {selection['backend']}"
                        f"{_decision(selection.get('decision'))}")
    table.add_column("backend", no_wrap=True)
    for column in ("status", "placement", "median ms", "p95 ms", "runs", "max rel err", "note"):
        table.add_column(column)
    fastest = min((f["median_ms"] for f in selection["figures"] if "median_ms" in f), default=None)
    for fig in selection["figures"]:
        median = fig.get("median_ms")
        ratio = f" ({median / fastest:.2f}x)" if median and fastest else ""
        table.add_row(
            ("* " if fig.get("chosen") else "  ") + fig["backend"],
            fig["status"],
            (fig.get("placement") or {}).get("verdict", "-"),
            f"{median:.3f}{ratio}" if median is not None else "-",
            f"{fig['p95_ms']:.3f}" if "p95_ms" in fig else "-",
            str(fig.get("runs", "-")),
            f"{fig['max_rel_error']:.1e}" if "max_rel_error" in fig else "-",
            fig.get("reason", ""),
        )
    console.print(table)
    cached = selection.get("compiled_cache") or {}
    if cached.get("cache") == "hit":
        console.print(f"compiled-model cache of {cached['backend']}: first load {cached['first_load_ms']:.1f} ms, "
                      f"from the cache {cached['cached_load_ms']:.1f} ms")
    elif cached:
        console.print(f"compiled-model cache of {cached['backend']}: none (this backend compiles nothing it could keep)")


def _decision(decision: dict[str, Any] | None) -> str:
    """How the pick was decided: the rule, and the ratio against the runner-up with its interval."""
    return f"\n{Decision.from_dict(decision).describe()}" if decision else ""
