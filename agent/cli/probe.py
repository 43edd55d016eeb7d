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

from agent.backends import absent_backends, candidate_backends, runtime_versions
from agent.cli.app import app
from agent.feeds import model_inputs, parse_input_shapes, resolve_shapes, synthetic_feeds
from agent.hardware import Hardware, probe_hardware
from agent.selection import select_backend


@app.command()
def probe(
    root: Path = typer.Option(Path("/"), "--root",
                              help="Root directory to read the hardware from (a device image or test tree)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document instead of tables."),
    model: Path | None = typer.Option(None, "--model", exists=True, dir_okay=False,
                                      help="Also benchmark every candidate backend on this ONNX model."),
    budget: float = typer.Option(5.0, "--budget", min=0.1, help="Seconds to spend timing the candidates of --model."),
    allow: list[str] | None = typer.Option(None, "--allow", help="Allowed execution provider or backend (repeat); default: all."),
    input_shape: list[str] = typer.Option([], "--input-shape",
                                          help="Shape of a dynamic input of --model, NAME=1x3x640x640 (repeatable)."),
) -> None:
    """Print the detected hardware, the available backends and, with --model, a benchmark table."""
    feeds = _feeds(model, input_shape) if model is not None else None
    hardware = probe_hardware(root)
    candidates = candidate_backends(hardware, allow)
    report: dict[str, Any] = {
        "hardware": hardware.to_dict(),
        "fingerprint": hardware.fingerprint(),
        "runtimes": runtime_versions(),
        "backends": [c.name for c in candidates],
        "absent": [a.to_dict() for a in absent_backends(hardware)],
    }
    if model is not None:
        report["selection"] = _benchmark(model, hardware, allow, budget, feeds, quiet=as_json)
    if as_json:
        typer.echo(json.dumps(report, indent=2))
        return
    _print(report)


def _feeds(model: Path, input_shape: list[str]) -> dict[str, np.ndarray] | None:
    """Inputs in the shapes given; a dynamic dim other than the batch without one is refused (never 1x1)."""
    specs = model_inputs(model)
    shapes = resolve_shapes(specs, parse_input_shapes(input_shape))
    return synthetic_feeds(specs, shapes) if input_shape else None  # None: the selector generates its own


def _benchmark(model: Path, hardware: Hardware, allow: list[str] | None, budget: float,
               feeds: dict[str, np.ndarray] | None, quiet: bool) -> dict[str, Any]:
    """Measure every candidate afresh (a throw-away cache: probe never reuses a decision)."""
    with tempfile.TemporaryDirectory() as cache, Progress(
        SpinnerColumn(), TextColumn("{task.description}"), transient=True, disable=quiet
    ) as bar:
        task = bar.add_task(f"measuring {model.name}")
        selection = select_backend(
            model,
            hardware=hardware,
            allowed_providers=allow,
            golden=feeds,
            expected=None,
            cache_dir=Path(cache),
            time_budget_s=budget,
            remeasure=True,
            progress=lambda text: bar.update(task, description=text),
        )
    return selection.to_dict()


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
    console.print(table)
    if "selection" in report:
        _print_selection(console, report["selection"])


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


def _decision(decision: dict[str, Any] | None) -> str:
    """How the pick was decided: faster beyond the noise, or a tie and the rule that broke it."""
    if not decision or decision.get("ratio") is None:
        return ""
    low, high = (f"{v:.2f}" if v is not None else "?" for v in decision["interval"])
    how = f"tie, broken by {decision['rule']}" if decision["tie"] else "faster"
    return (f"\n{how}: {decision['runner_up']} {decision['ratio']:.2f}x [{low}, {high}] "
            f"at {decision['confidence']:.0%}, {decision['blocks']} blocks")
