"""Rollout commands: ``deploy --fleet``, ``rollout list|status|log|pause|resume|abort|retry-failed``, ``device show``."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import typer
from rich.console import Group
from rich.live import Live
from rich.progress import BarColumn, Progress, TextColumn
from rich.table import Table

from agent.errors import NotFoundError, OperationFailed, UserError
from edgectl.cli.app import app, options
from edgectl.cli.output import console, print_json, print_table
from edgectl.cli.security import device_app
from edgectl.config import load_edgectl_config
from edgectl.controller import RolloutOptions, SqliteStore, parse_gate, parse_waves, plan_rollout, submit_rollout
from edgectl.controller.engine import FINAL, REQUESTS
from edgectl.controller.gates import parse_duration, parse_rate
from edgectl.controller.planner import Plan
from edgectl.controller.reports import package_info

rollout_app = typer.Typer(help="Follow and steer staged rollouts (run by `edgectl controller run`).", no_args_is_help=True)
app.add_typer(rollout_app, name="rollout")



def open_store(ctx: typer.Context, must_exist: bool = True) -> SqliteStore:
    """The store named by the config's ``controller.store`` (default $EDGECTL_HOME/controller.db)."""
    path = load_edgectl_config(options(ctx).config).controller.store_path()
    if must_exist and not path.exists():
        raise NotFoundError(f"no controller store at {path}: deploy with --fleet first")
    return SqliteStore(path)


def fleet_deploy(ctx: typer.Context, artifacts: list[Path], selector: str, waves: str, max_failure: str, bake: str,
                 gates: list[str], shadow: bool, dry_run: bool, wait: bool, allow_downgrade: bool, as_json: bool) -> None:
    """Plan a staged rollout and hand it to the controller (see `deploy --help`)."""
    from edgectl.cli.fleet import _package, fleet_devices

    parse_waves(waves)
    for g in gates:
        parse_gate(g)
    shadow_gates = list(gates) + (["agreement >= 0.99"] if shadow and not any("agreement" in g for g in gates) else [])
    opts = RolloutOptions(selector, parse_rate(max_failure, "--max-failure"), parse_duration(bake, "--bake"), shadow_gates,
                          shadow, allow_downgrade, load_edgectl_config(options(ctx).config).deploy.timeout_s)
    with tempfile.TemporaryDirectory(prefix="edgectl-fleet-") as tmp:
        packages = []
        for i, path in enumerate(artifacts):
            (Path(tmp) / str(i)).mkdir()
            packages.append(_package(path, None, None, Path(tmp) / str(i), 0))
        devices = fleet_devices(ctx, selector)
        if not devices:
            raise UserError(f"selector {selector!r} matches no device (see `edgectl devices`)")
        plan = plan_rollout(devices, packages, waves, opts.bake_s)
        _check_downgrade(plan, devices, allow_downgrade)
        if dry_run:
            return _print_plan(plan, as_json)
        rollout_id = submit_rollout(open_store(ctx, must_exist=False), plan, opts)
    if as_json and not wait:
        print_json({"rollout_id": rollout_id, "plan": plan.to_dict()})
        return
    if not as_json:
        console.print(f"rollout {rollout_id}: {len(plan.devices)} device(s) in {plan.waves} wave(s); "
                      f"{len(plan.skipped)} skipped. `edgectl controller run` drives it.")
    if wait:
        _follow(open_store(ctx), rollout_id, as_json)


def _check_downgrade(plan: Plan, devices: list[dict[str, Any]], allow: bool) -> None:
    by_id = {d["device_id"]: d for d in devices}
    older = []
    for d in plan.devices:
        m = plan.packages[d.variant].manifest if d.variant else None
        current = by_id[d.device_id]
        if m and current.get("model") == m.name and (current.get("version") or 0) > m.version:
            older.append(f"{d.device_id} runs v{current['version']}")
    if older and not allow:
        raise UserError(f"refusing a downgrade ({'; '.join(older[:5])}): pass --allow-downgrade to roll back on purpose")


def _print_plan(plan: Plan, as_json: bool) -> None:
    data = plan.to_dict()
    if as_json:
        print_json(data)
        return
    for wave in data["waves"]:
        print_table(f"wave {wave['wave']}: {len(wave['devices'])} device(s), {wave['bytes']} bytes",
                    ["DEVICE", "TARGET", "VARIANT"], [(d["device_id"], d["target"], d["variant"]) for d in wave["devices"]])
    if data["skipped"]:
        print_table("skipped", ["DEVICE", "TARGET", "REASON"], [(d["device_id"], d["target"], d["reason"]) for d in data["skipped"]])
    console.print(f"total {data['total_bytes']} bytes; estimated {data['estimated_s']:.0f}s (bake {data['bake_s']:.0f}s per wave)")


def rollout_summary(store: SqliteStore, rollout_id: str) -> dict[str, Any]:
    rollout = store.rollout(rollout_id)
    if rollout is None:
        raise NotFoundError(f"no rollout {rollout_id!r} (see `edgectl rollout list`)")
    rows = store.rollout_devices(rollout_id)
    return {
        "id": rollout.id, "status": rollout.status, "wave": rollout.wave, "waves": rollout.spec["wave_count"],
        "phase": rollout.phase, "reason": rollout.reason, "created": rollout.created, "selector": rollout.spec["selector"],
        "gates": rollout.spec["gates"], "bake_s": rollout.spec["bake_s"], "max_failure": rollout.spec["max_failure"],
        "packages": [p["label"] for p in rollout.spec["packages"]],
        "devices": [{"device_id": r.device_id, "wave": r.wave, "status": r.status, "state": r.state, "detail": r.detail,
                     "variant": package_info(rollout, r.variant)["label"] if r.variant else None,
                     "backend": r.data.get("backend"), "health_p95_ms": r.data.get("health_p95_ms"),
                     "shadow": r.data.get("shadow")} for r in rows],
        "skipped": [{"device_id": r.device_id, "reason": r.detail} for r in rows if r.status == "skipped"],
    }


def _view(summary: dict[str, Any]) -> Group:
    bars = Progress(TextColumn("{task.description:<10}"), BarColumn(), TextColumn("{task.fields[label]}"), console=console)
    for wave in range(1, summary["waves"] + 1):
        rows = [d for d in summary["devices"] if d["wave"] == wave]
        done = sum(d["status"] in ("ok", "failed", "rolled-back", "cancelled") for d in rows)
        counts = ", ".join(f"{n} {s}" for s, n in sorted(_count(rows).items()))
        bars.add_task(f"wave {wave}", total=max(len(rows), 1), completed=done, label=counts)
    table = Table(title=f"rollout {summary['id']}: {summary['status']} (wave {summary['wave']}/{summary['waves']}, {summary['phase']}) {summary['reason']}",
                  title_justify="left", header_style="bold")
    for column in ("DEVICE", "WAVE", "VARIANT", "STATUS", "STATE", "BACKEND", "DETAIL"):
        table.add_column(column)
    for d in summary["devices"]:
        table.add_row(d["device_id"], str(d["wave"]), d["variant"] or "-", d["status"], d["state"], str(d["backend"] or ""), d["detail"][:60])
    return Group(bars, table)


def _count(rows: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    return counts


def _follow(store: SqliteStore, rollout_id: str, as_json: bool, timeout_s: float = 24 * 3600) -> None:
    deadline = time.monotonic() + timeout_s
    summary = rollout_summary(store, rollout_id)
    if as_json:
        while summary["status"] not in FINAL and time.monotonic() < deadline:
            time.sleep(0.5)
            summary = rollout_summary(store, rollout_id)
        print_json(summary)
    else:
        with Live(_view(summary), console=console, refresh_per_second=2) as live:
            while summary["status"] not in FINAL and time.monotonic() < deadline:
                time.sleep(0.5)
                summary = rollout_summary(store, rollout_id)
                live.update(_view(summary))
    if summary["status"] != "done":
        raise OperationFailed(f"rollout {rollout_id} ended {summary['status']}: {summary['reason']}")


@rollout_app.command("list")
def rollout_list(ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List rollouts, newest last."""
    store = open_store(ctx)
    rows = [rollout_summary(store, r.id) for r in store.rollouts()]
    if as_json:
        print_json([{k: v for k, v in r.items() if k != "devices"} | {"device_counts": _count(r["devices"])} for r in rows])
        return
    print_table("rollouts", ["ID", "STATUS", "WAVE", "PACKAGES", "DEVICES", "REASON"], [
        (r["id"], r["status"], f"{r['wave']}/{r['waves']}", ", ".join(r["packages"]),
         ", ".join(f"{n} {s}" for s, n in sorted(_count(r["devices"]).items())), r["reason"]) for r in rows])


@rollout_app.command("status")
def rollout_status(
    ctx: typer.Context,
    rollout_id: str = typer.Argument(..., help="Rollout id (see `edgectl rollout list`)."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Live view until the rollout ends."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Progress per wave and every device's state (JSON: with the audit log); with --follow a live view."""
    store = open_store(ctx)
    if follow:
        _follow(store, rollout_id, as_json)
        return
    summary = rollout_summary(store, rollout_id)
    if as_json:
        summary["audit"] = store.audit_log(rollout_id)
        print_json(summary)
    else:
        console.print(_view(summary))


@rollout_app.command("log")
def rollout_log(
    ctx: typer.Context,
    rollout_id: str = typer.Argument(..., help="Rollout id (see `edgectl rollout list`)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """The audit log: every operator action, controller decision and device transition, oldest first."""
    store = open_store(ctx)
    rollout_summary(store, rollout_id)
    entries = store.audit_log(rollout_id, limit=100_000)
    if as_json:
        print_json(entries)
        return
    print_table(f"rollout {rollout_id}", ["TIME", "ACTOR", "DEVICE", "ACTION", "DETAIL"], [
        (time.strftime("%H:%M:%S", time.localtime(e["ts"])), e["actor"], e["device_id"], e["action"], e["detail"][:80])
        for e in entries])


def _request(ctx: typer.Context, rollout_id: str, action: str, as_json: bool) -> None:
    store = open_store(ctx)
    status = rollout_summary(store, rollout_id)["status"]
    if status not in REQUESTS[action]:
        raise UserError(f"cannot {action} rollout {rollout_id}: it is {status} ({action} applies to {' or '.join(REQUESTS[action])})")
    store.request(rollout_id, action)
    store.audit(f"{action} requested", "", rollout_id, actor="operator")
    if as_json:
        print_json({"rollout_id": rollout_id, "requested": action})
    else:
        console.print(f"{action} requested for {rollout_id}; the controller applies it within a second")


@rollout_app.command("pause")
def rollout_pause(ctx: typer.Context, rollout_id: str = typer.Argument(..., help="Rollout id."), as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Stop starting and promoting waves; devices already updating finish, gates keep watching."""
    _request(ctx, rollout_id, "pause", as_json)


@rollout_app.command("resume")
def rollout_resume(ctx: typer.Context, rollout_id: str = typer.Argument(..., help="Rollout id."), as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Continue a paused rollout."""
    _request(ctx, rollout_id, "resume", as_json)


@rollout_app.command("abort")
def rollout_abort(ctx: typer.Context, rollout_id: str = typer.Argument(..., help="Rollout id."), as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Stop for good: devices not sent yet (or offline) never get it; devices that took it are rolled back."""
    _request(ctx, rollout_id, "abort", as_json)


@rollout_app.command("retry-failed")
def rollout_retry(ctx: typer.Context, rollout_id: str = typer.Argument(..., help="Rollout id."), as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Send the update again to the failed devices of started waves; they join the current wave."""
    _request(ctx, rollout_id, "retry-failed", as_json)


@device_app.command("show")
def device_show(
    ctx: typer.Context,
    device_id: str = typer.Argument(..., help="Device id."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """One device: registry record, recent events, latency history (with a terminal sparkline)."""
    store = open_store(ctx)
    row = store.device(device_id)
    if row is None:
        raise NotFoundError(f"device {device_id!r} is not in the controller store (is `edgectl controller run` running?)")
    from edgectl.registry import DeviceRecord

    detail = {**DeviceRecord.from_row(row).to_dict(), "hardware": row.birth.get("hardware"), "telemetry": row.telemetry,
              "events": store.events(device_id), "latency": store.latency(device_id, limit=200),
              "audit": store.audit_log(device_id=device_id, limit=50)}
    if as_json:
        print_json(detail)
        return
    console.print(f"[bold]{device_id}[/bold] {detail['status']} target={detail['target']} model={detail['model']} "
                  f"v{detail['version']} backend={detail['backend']} tags={detail['tags']}")
    print_table("recent events", ["TIME", "DEPLOYMENT", "STATE", "STATUS", "DETAIL"], [
        (time.strftime("%H:%M:%S", time.localtime(e["ts"])), e["deployment_id"], e["state"], e["status"], e["detail"][:60])
        for e in detail["events"]])
    points = [p["p95_ms"] for p in detail["latency"]]
    if points:
        console.print(f"p95 latency ms ({len(points)} points, {min(points):.2f}..{max(points):.2f}): {_sparkline(points)}")


def _sparkline(values: list[float]) -> str:
    ticks = "▁▂▃▄▅▆▇█"
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    return "".join(ticks[int((v - low) / span * (len(ticks) - 1))] for v in values[-80:])
