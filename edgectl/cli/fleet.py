"""Fleet commands: deploy, devices."""

from __future__ import annotations

import queue
import tempfile
import time
from pathlib import Path
from typing import Optional

import typer
from rich.progress import BarColumn, Progress, TextColumn

from agent.errors import OperationFailed, UserError
from agent.protocol.envelope import TrustedKeys, load_public_key
from agent.protocol.manifest import TargetInfo
from agent.protocol.topics import validate_id
from agent.transport import Message
from edgectl.cli.app import options
from edgectl.cli.app import app
from edgectl.cli.output import console, print_json, print_table
from edgectl.config import load_edgectl_config
from edgectl.connection import open_transport
from edgectl.direct_deploy import DeviceProgress, deploy_to_devices
from edgectl.keys import Keyring
from edgectl.package import BuildOptions, Package, build_package, read_package
from edgectl.registry import collect_devices

STEPS = ("download", "verify", "stage", "activate", "health", "commit")


def _package(path: Path, name: Optional[str], version: Optional[int], workdir: Path, chunk_size: int) -> Package:
    """A verified package: given as .edgepkg, or built and signed here from an .onnx model."""
    ring = Keyring()
    if path.suffix != ".onnx":
        trusted = TrustedKeys([load_public_key(ring.public_pem("package", r["key_id"])) for r in ring.list() if r["role"] == "package"])
        return read_package(path, trusted, workdir)
    if not name or version is None:
        raise UserError("deploying a .onnx model needs --name and --version (or build a package with `edgectl build`)")
    out = workdir / f"{name}-{version}.edgepkg"
    build_package(path, BuildOptions(name, version, TargetInfo("any"), chunk_size=chunk_size), ring.signing_key("package"), out)
    return read_package(out, TrustedKeys([ring.signing_key("package").public_key()]), workdir)


@app.command()
def deploy(
    ctx: typer.Context,
    artifact: Path = typer.Argument(..., exists=True, dir_okay=False, help="MODEL.onnx (built and signed here) or PKG.edgepkg."),
    device: list[str] = typer.Option(..., "--device", "-d", help="Device id to deploy to (repeatable)."),
    name: Optional[str] = typer.Option(None, "--name", help="Model name (for a .onnx model)."),
    version: Optional[int] = typer.Option(None, "--version", min=1, help="Model version (for a .onnx model)."),
    timeout: Optional[float] = typer.Option(None, "--timeout", help="Seconds to wait for every device (default from config: 600)."),
    allow_downgrade: bool = typer.Option(False, "--allow-downgrade", help="Let devices install a lower version than they committed."),
    as_json: bool = typer.Option(False, "--json", help="Print the outcome as JSON."),
) -> None:
    """Deploy a model to devices and follow each until it commits, rolls back or fails.

    Exit code 0 when every device committed the model, 5 when any did not."""
    for d in device:
        validate_id(d)
    opts = options(ctx)
    config = load_edgectl_config(opts.config)
    inbox: "queue.Queue[Message]" = queue.Queue()
    with tempfile.TemporaryDirectory(prefix="edgectl-deploy-") as tmp:
        package = _package(artifact, name, version, Path(tmp), config.deploy.chunk_size)
        m = package.manifest
        if not as_json:
            console.print(f"deploying {m.name} v{m.version} ({m.payload.size} bytes, {len(m.payload.chunks)} chunks) to {', '.join(device)}")
        transport = open_transport(opts.broker, config, inbox)
        try:
            deployment_id, results = _run_with_progress(transport, inbox, package, device, timeout or config.deploy.timeout_s,
                                                        allow_downgrade, show=not as_json)
        finally:
            transport.close()
    rows = [{"device_id": p.device_id, "status": p.status, "state": p.state, "detail": p.detail,
             "backend": p.data.get("backend")} for p in results.values()]
    if as_json:
        print_json({"deployment_id": deployment_id, "model": m.name, "version": m.version, "devices": rows})
    else:
        print_table(f"deployment {deployment_id}", ["DEVICE", "STATUS", "STATE", "BACKEND", "DETAIL"],
                    [(r["device_id"], r["status"], r["state"], r["backend"], r["detail"]) for r in rows])
    failed = [r["device_id"] for r in rows if r["status"] != "ok"]
    if failed:
        raise OperationFailed(f"{len(failed)} of {len(rows)} device(s) did not commit: {', '.join(failed)}")


def _run_with_progress(transport, inbox, package, devices, timeout, allow_downgrade, show):  # type: ignore[no-untyped-def]
    key = Keyring().signing_key("controller")
    if not show:
        return deploy_to_devices(transport, inbox, package, devices, key, timeout, allow_downgrade=allow_downgrade)
    with Progress(TextColumn("{task.description:<24}"), BarColumn(), TextColumn("{task.fields[state]}"), console=console) as bar:
        tasks = {d: bar.add_task(d, total=len(STEPS), state="waiting") for d in devices}

        def update(p: DeviceProgress) -> None:
            step = STEPS.index(p.state) + (1 if p.done else 0) if p.state in STEPS else 0
            label = p.state if not p.done else p.status
            bar.update(tasks[p.device_id], completed=len(STEPS) if p.status == "ok" else step, state=label)

        return deploy_to_devices(transport, inbox, package, devices, key, timeout, update, allow_downgrade)


@app.command()
def devices(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """List devices known to the broker: presence, agent, target, active model and backend."""
    opts = options(ctx)
    config = load_edgectl_config(opts.config)
    inbox: "queue.Queue[Message]" = queue.Queue()
    transport = open_transport(opts.broker, config, inbox)
    try:
        records = collect_devices(transport, inbox)
    finally:
        transport.close()
    rows = [r.to_dict() for _, r in sorted(records.items())]
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
