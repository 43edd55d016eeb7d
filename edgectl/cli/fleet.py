"""Fleet commands: deploy, devices."""

from __future__ import annotations

import queue
import tempfile
import time
from pathlib import Path

import typer
from rich.progress import BarColumn, Progress, TextColumn

from edgecore.errors import OperationFailed, UserError, listing
from edgecore.protocol.topics import validate_id
from edgecore.transport import Message, MqttTransport
from edgectl.artifacts.urls import check_artifact_urls
from edgectl.cli.app import app, options
from edgectl.cli.output import console, print_json, print_table
from edgectl.cli.rollout import fleet_deploy
from edgectl.config import load_edgectl_config
from edgectl.connection import open_transport
from edgectl.fleet import FleetRequest, fleet_devices, load_package
from edgectl.fleet.direct import DeviceProgress, deploy_to_devices
from edgectl.keys import Keyring
from edgectl.package import Package

STEPS = ("download", "verify", "stage", "activate", "health", "commit")


@app.command()
def deploy(
    ctx: typer.Context,
    artifacts: list[Path] = typer.Argument(
        ..., exists=True, dir_okay=False,
        help="MODEL.onnx (built and signed here) or PKG.edgepkg; with --fleet, one package per target; with --device, "
             "several packages (models and pipelines) are the whole set each device runs."),
    device: list[str] = typer.Option(
        [], "--device", "-d", help="Device id to deploy to directly, in the foreground (repeatable)."),
    fleet: str | None = typer.Option(
        None, "--fleet", help="Selector (group=lobby,target=jetson-orin, all, or group:NAME for a device group of the "
        "store): hand a staged rollout to the controller."),
    waves: str = typer.Option("1,10%,50%,100%", "--waves", help="Cumulative wave sizes: counts or percentages."),
    max_failure: str = typer.Option("5%", "--max-failure", help="Install failure rate that halts a wave."),
    bake: str = typer.Option("10m", "--bake", help="Time a wave must run with all gates holding before the next starts."),
    gate: list[str] = typer.Option(
        [], "--gate", help="Gate expression, e.g. 'p95_latency <= 1.2x' (repeatable; see docs/fleet.md)."),
    shadow: bool = typer.Option(
        False, "--shadow", help="Ask canaries for a shadow run and its agreement (gate: agreement >= 0.99)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan (waves, variants, bytes, duration); send nothing."),
    wait: bool = typer.Option(False, "--wait", help="Follow the rollout until it ends (exit 5 unless done)."),
    name: str | None = typer.Option(None, "--name", help="Model name (for a .onnx model)."),
    version: int | None = typer.Option(None, "--version", min=1, help="Model version (for a .onnx model)."),
    timeout: float | None = typer.Option(None, "--timeout", help="Seconds to wait for every device (default from config: 600)."),
    allow_downgrade: bool = typer.Option(
        False, "--allow-downgrade", help="Let devices install a lower version than they committed."),
    artifact_url: list[str] = typer.Option(
        [], "--artifact-url", help="HTTP(S) URL devices fetch the payload from by Range before MQTT chunks (repeatable, "
        "tried in order; {artifact_id} is replaced by each package's payload sha256; see `edgectl artifacts`)."),
    max_per_minute: int = typer.Option(
        0, "--max-per-minute", min=0, help="Pace each wave: N devices get their desired state a minute (0: all at once)."),
    allow_no_data: bool = typer.Option(
        False, "--allow-no-data", help="Promote a baked wave even when a gate has no data (no latency baseline, no "
        "requests); recorded in the rollout. Without it such a wave waits for data, then halts."),
    start_at: str | None = typer.Option(
        None, "--start-at", help="With --fleet: start the rollout then (ISO 8601 with an offset, e.g. "
        "2026-11-28T02:00:00+01:00), by the controller's clock; it is `scheduled` until then."),
    deadline: str | None = typer.Option(
        None, "--deadline", help="With --fleet: the forced-update deadline (ISO 8601 with an offset): from then on the "
        "maintenance windows of the devices' groups (`edgectl group windows`) no longer hold them back."),
    as_json: bool = typer.Option(False, "--json", help="Print the outcome as JSON."),
) -> None:
    """Deploy a model: directly to --device IDs, or as a staged rollout to a --fleet selector.

    With --device: follow each device until it commits; exit 0 when all did, 5 otherwise.
    With --fleet: record a rollout for `edgectl controller run` and return (or follow it with --wait)."""
    if bool(device) == bool(fleet):
        raise UserError("give either --device ID... (direct) or --fleet SELECTOR (staged rollout)")
    if fleet is not None:
        request = FleetRequest(artifacts, fleet, waves, max_failure, bake, gate, shadow, allow_downgrade, dry_run,
                               artifact_urls=artifact_url, max_per_minute=max_per_minute, allow_no_data=allow_no_data,
                               start_at=start_at, deadline=deadline)
        fleet_deploy(ctx, request, wait, as_json)
        return
    if start_at is not None or deadline is not None:
        raise UserError("--start-at and --deadline are for a --fleet rollout; a --device deploy runs now")
    if len(artifacts) > 1 and (name or version):
        raise UserError("--name and --version build one .onnx model; give several artifacts as .edgepkg packages")
    urls = check_artifact_urls(artifact_url, len(artifacts))
    for d in device:
        validate_id(d)
    opts = options(ctx)
    config = load_edgectl_config(opts.config)
    inbox: queue.Queue[Message] = queue.Queue()
    with tempfile.TemporaryDirectory(prefix="edgectl-deploy-") as tmp:
        workdirs = [Path(tmp) / str(n) for n in range(len(artifacts))]
        for workdir in workdirs:  # one each: every payload is payload.tar in its own
            workdir.mkdir()
        packages = [load_package(artifact, name, version, workdir, config.deploy.chunk_size)
                    for artifact, workdir in zip(artifacts, workdirs, strict=True)]
        m = packages[0].manifest
        if not as_json:
            what = ", ".join(f"{p.manifest.name} v{p.manifest.version}" for p in packages)
            console.print(f"deploying {what} ({sum(p.manifest.payload.size for p in packages)} bytes) to {', '.join(device)}")
        transport = open_transport(opts.broker, config, inbox)
        try:
            deployment_id, results = _run_with_progress(transport, inbox, packages, device, timeout or config.deploy.timeout_s,
                                                        allow_downgrade, show=not as_json, urls=urls)
        finally:
            transport.close()
    rows = [{"device_id": p.device_id, "status": p.status, "state": p.state, "detail": p.detail,
             "backend": p.data.get("backend"), **({"models": p.models} if p.models else {})} for p in results.values()]
    if as_json:
        print_json({"deployment_id": deployment_id, "model": m.name, "version": m.version, "devices": rows,
                    "packages": [{"name": p.manifest.name, "version": p.manifest.version, "kind": p.manifest.kind}
                                 for p in packages]})
    else:
        print_table(f"deployment {deployment_id}", ["DEVICE", "STATUS", "STATE", "BACKEND", "DETAIL"],
                    [(r["device_id"], r["status"], r["state"], r["backend"], r["detail"]) for r in rows])
    failed = [p.device_id for p in results.values() if p.status != "ok"]
    if failed:
        raise OperationFailed(f"{len(failed)} of {len(rows)} device(s) did not commit: {listing(failed)}")


def _run_with_progress(transport: MqttTransport, inbox: queue.Queue[Message], package: list[Package], devices: list[str],
                       timeout: float, allow_downgrade: bool, show: bool,
                       urls: tuple[str, ...] = ()) -> tuple[str, dict[str, DeviceProgress]]:
    key = Keyring().signing_key("controller")
    if not show:
        return deploy_to_devices(transport, inbox, package, devices, key, timeout, allow_downgrade=allow_downgrade,
                                 artifact_urls=urls)
    with Progress(TextColumn("{task.description:<24}"), BarColumn(), TextColumn("{task.fields[state]}"), console=console) as bar:
        tasks = {d: bar.add_task(d, total=len(STEPS), state="waiting") for d in devices}

        def update(p: DeviceProgress) -> None:
            step = STEPS.index(p.state) + (1 if p.done else 0) if p.state in STEPS else 0
            label = p.state if not p.done else p.status
            bar.update(tasks[p.device_id], completed=len(STEPS) if p.status == "ok" else step, state=label)

        return deploy_to_devices(transport, inbox, package, devices, key, timeout, update, allow_downgrade, artifact_urls=urls)


@app.command()
def devices(
    ctx: typer.Context,
    selector: str = typer.Option(
        "all", "--selector", "-s",
        help="Only devices matching k=v[,k=v] (fields id, target, model, version, status, agent, site, or tag keys), "
        "or the devices of group:NAME."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """List devices known to the broker: presence, agent, target, active model and backend."""
    opts = options(ctx)
    rows = fleet_devices(opts.broker, load_edgectl_config(opts.config), selector)
    if as_json:
        print_json(rows)
        return
    now = time.time()
    print_table("devices", ["DEVICE", "STATUS", "AGENT", "TARGET", "MODEL", "BACKEND", "LAST SEEN"], [
        (r["device_id"], r["status"], r["agent_version"], r["target"],
         f"{r['model']} v{r['version']}" if r["model"] else "-", r["backend"],
         f"{now - r['last_seen']:.0f}s ago" if r["last_seen"] else "-")
        for r in rows
    ])
