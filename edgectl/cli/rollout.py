"""Rollout commands: ``deploy --fleet``, ``rollout list|status|log|pause|resume|abort|retry-failed|approve|reject``,
``device show``.

Only arguments and printing live here; what the commands do is :mod:`edgectl.fleet`.
"""

from __future__ import annotations

import time
from typing import Any

import typer
from rich.console import Group
from rich.live import Live
from rich.progress import BarColumn, Progress, TextColumn
from rich.table import Table

from edgectl.cli.access import _actor
from edgectl.cli.app import app, options
from edgectl.cli.output import console, print_json, print_table
from edgectl.cli.security import device_app
from edgectl.config import load_edgectl_config
from edgectl.controller.planner import Plan
from edgectl.controller.records import FINISHED
from edgectl.controller.store import Store
from edgectl.fleet import (
    FleetRequest,
    approve_rollout,
    check_done,
    deploy_fleet,
    device_detail,
    open_store,
    reject_rollout,
    request_action,
    rollout_summary,
    wait_rollout,
)

ROLLOUT_ID = typer.Argument(..., help="Rollout id (see `edgectl rollout list`).")
JSON = typer.Option(False, "--json", help="Print JSON.")

rollout_app = typer.Typer(help="Follow and steer staged rollouts (run by `edgectl controller run`).", no_args_is_help=True)
app.add_typer(rollout_app, name="rollout")


def _store(ctx: typer.Context) -> Store:
    return open_store(load_edgectl_config(options(ctx).config))


def fleet_deploy(ctx: typer.Context, request: FleetRequest, wait: bool, as_json: bool) -> None:
    """Plan a staged rollout and hand it to the controller (see `deploy --help`)."""
    opts = options(ctx)
    plan, rollout_id = deploy_fleet(request, opts.broker, load_edgectl_config(opts.config), _actor())
    if rollout_id is None:
        return _print_plan(plan, as_json)
    if as_json and not wait:
        print_json({"rollout_id": rollout_id, "plan": plan.to_dict()})
        return
    if not as_json:
        console.print(f"rollout {rollout_id}: {len(plan.devices)} device(s) in {plan.waves} wave(s); "
                      f"{len(plan.skipped)} skipped. `edgectl controller run` drives it.")
        summary = rollout_summary(_store(ctx), rollout_id)
        if summary["approval"]:
            console.print(f"awaiting approval ({summary['approval']}): `edgectl rollout approve {rollout_id}` "
                          "by another operator")
        elif summary["status"] == "scheduled":
            console.print(f"scheduled: starts at {summary['start_at']}")
    if wait:
        _follow(_store(ctx), rollout_id, as_json)


def _print_plan(plan: Plan, as_json: bool) -> None:
    data = plan.to_dict()
    if as_json:
        print_json(data)
        return
    for wave in data["waves"]:
        print_table(f"wave {wave['wave']}: {len(wave['devices'])} device(s), {wave['bytes']} bytes",
                    ["DEVICE", "TARGET", "VARIANT", "NOTE"],
                    [(d["device_id"], d["target"], d["variant"], d["note"]) for d in wave["devices"]])
    if data["skipped"]:
        print_table("skipped", ["DEVICE", "TARGET", "REASON"],
                    [(d["device_id"], d["target"], d["reason"]) for d in data["skipped"]])
    console.print(f"total {data['total_bytes']} bytes; estimated {data['estimated_s']:.0f}s "
                  f"(bake {data['bake_s']:.0f}s per wave)")


def _view(summary: dict[str, Any]) -> Group:
    bars = Progress(TextColumn("{task.description:<10}"), BarColumn(), TextColumn("{task.fields[label]}"), console=console)
    for wave in range(1, summary["waves"] + 1):
        rows = [d for d in summary["devices"] if d["wave"] == wave]
        done = sum(d["status"] in FINISHED for d in rows)
        counts = ", ".join(f"{n} {s}" for s, n in sorted(_count(rows).items()))
        bars.add_task(f"wave {wave}", total=max(len(rows), 1), completed=done, label=counts)
    title = (f"rollout {summary['id']}: {summary['status']} (wave {summary['wave']}/{summary['waves']}, {summary['phase']}) "
             f"{summary['reason']}")
    table = Table(title=title, title_justify="left", header_style="bold")
    for column in ("DEVICE", "WAVE", "VARIANT", "STATUS", "STATE", "BACKEND", "DETAIL"):
        table.add_column(column)
    for d in summary["devices"]:
        table.add_row(d["device_id"], str(d["wave"]), d["variant"] or "-", d["status"], d["state"], str(d["backend"] or ""),
                      d["detail"][:60])
    return Group(bars, table)


def _count(rows: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    return counts


def _follow(store: Store, rollout_id: str, as_json: bool) -> None:
    if as_json:
        summary = wait_rollout(store, rollout_id)
        print_json(summary)
    else:
        with Live(_view(rollout_summary(store, rollout_id)), console=console, refresh_per_second=2) as live:
            summary = wait_rollout(store, rollout_id, lambda s: live.update(_view(s)))
    check_done(summary)


@rollout_app.command("list")
def rollout_list(ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List rollouts, newest last."""
    store = _store(ctx)
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
    store = _store(ctx)
    if follow:
        _follow(store, rollout_id, as_json)
        return
    summary = rollout_summary(store, rollout_id)
    if as_json:
        summary["audit"] = [a.to_dict() for a in store.audit_log(rollout_id)]
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
    store = _store(ctx)
    rollout_summary(store, rollout_id)
    entries = [a.to_dict() for a in store.audit_log(rollout_id, limit=100_000)]
    if as_json:
        print_json(entries)
        return
    print_table(f"rollout {rollout_id}", ["TIME", "ACTOR", "DEVICE", "ACTION", "DETAIL"], [
        (time.strftime("%H:%M:%S", time.localtime(e["ts"])), e["actor"], e["device_id"], e["action"], e["detail"][:80])
        for e in entries])


def _request(ctx: typer.Context, rollout_id: str, action: str, as_json: bool) -> None:
    request_action(_store(ctx), rollout_id, action)
    if as_json:
        print_json({"rollout_id": rollout_id, "requested": action})
    else:
        console.print(f"{action} requested for {rollout_id}; the controller applies it within a second")


@rollout_app.command("pause")
def rollout_pause(ctx: typer.Context, rollout_id: str = ROLLOUT_ID, as_json: bool = JSON) -> None:
    """Stop starting and promoting waves; devices already updating finish, gates keep watching."""
    _request(ctx, rollout_id, "pause", as_json)


@rollout_app.command("resume")
def rollout_resume(ctx: typer.Context, rollout_id: str = ROLLOUT_ID, as_json: bool = JSON) -> None:
    """Continue a paused rollout."""
    _request(ctx, rollout_id, "resume", as_json)


@rollout_app.command("abort")
def rollout_abort(ctx: typer.Context, rollout_id: str = ROLLOUT_ID, as_json: bool = JSON) -> None:
    """Stop for good: devices not sent yet (or offline) never get it; devices that took it are rolled back."""
    _request(ctx, rollout_id, "abort", as_json)


@rollout_app.command("retry-failed")
def rollout_retry(ctx: typer.Context, rollout_id: str = ROLLOUT_ID, as_json: bool = JSON) -> None:
    """Send the update again to the failed devices of started waves; they join the current wave."""
    _request(ctx, rollout_id, "retry-failed", as_json)


@rollout_app.command("approve")
def rollout_approve(ctx: typer.Context, rollout_id: str = ROLLOUT_ID, as_json: bool = JSON) -> None:
    """Approve a rollout awaiting approval (two-person rule: not as its creator); it starts at its start time, or now."""
    rollout = approve_rollout(_store(ctx), rollout_id, _actor())
    if as_json:
        print_json({"rollout_id": rollout_id, "status": rollout.status.value, "approved_by": _actor()})
    else:
        console.print(f"rollout {rollout_id} approved by {_actor()}: {rollout.status}; the controller starts it "
                      "at its start time, or within a second")


@rollout_app.command("reject")
def rollout_reject(
    ctx: typer.Context,
    rollout_id: str = ROLLOUT_ID,
    reason: str = typer.Option(..., "--reason", help="Why, in one line (kept in the audit log)."),
    as_json: bool = JSON,
) -> None:
    """Reject a rollout awaiting approval: it ends rejected and nothing is sent."""
    rollout = reject_rollout(_store(ctx), rollout_id, _actor(), reason)
    if as_json:
        print_json({"rollout_id": rollout_id, "status": rollout.status.value, "reason": rollout.reason})
    else:
        console.print(f"rollout {rollout_id} {rollout.status}: {rollout.reason}")


@device_app.command("show")
def device_show(
    ctx: typer.Context,
    device_id: str = typer.Argument(..., help="Device id."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """One device: registry record, recent events, latency history (with a terminal sparkline)."""
    detail = device_detail(_store(ctx), device_id)
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
