"""Package commands: keys, build, pipeline build, verify."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import typer

from edgecore.errors import UserError
from edgecore.protocol.envelope import TrustedKeys, key_id, load_public_key
from edgecore.protocol.manifest import TargetInfo
from edgecore.protocol.trust import KeyRotation
from edgectl.cli.app import app
from edgectl.cli.output import console, print_json, print_table
from edgectl.keys import ROLES, Keyring
from edgectl.package import BuildOptions, build_package, read_package
from edgectl.sequence import next_sequence

keys_app = typer.Typer(help="Manage the ed25519 keys that sign packages and controller messages.", no_args_is_help=True)
app.add_typer(keys_app, name="keys")
pipeline_app = typer.Typer(help="Pipelines: steps over models of a device's set and ONNX processing graphs, served "
                                "under their own name (docs/packages.md#pipelines).", no_args_is_help=True)
app.add_typer(pipeline_app, name="pipeline")


@keys_app.command("init")
def keys_init() -> None:
    """Create the package and controller signing keys (keeps existing ones)."""
    ring = Keyring()
    for role in ROLES:
        kid, created = ring.init(role)
        console.print(f"{role} key {kid} {'created' if created else 'already exists'} in {ring.root / role}")


@keys_app.command("list")
def keys_list(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List signing keys; the active key of each role signs."""
    rows = Keyring().list()
    if as_json:
        print_json(rows)
        return
    print_table("signing keys", ["ROLE", "KEY ID", "ACTIVE", "CREATED"],
                [(r["role"], r["key_id"], "yes" if r["active"] else "", r["created"]) for r in rows])


@keys_app.command("export")
def keys_export(
    role: str = typer.Argument("package", help="package or controller."),
    key_id: str | None = typer.Option(None, "--key-id", help="A key other than the active one."),
    out: Path | None = typer.Option(None, "-o", "--out", help="Write the PEM here instead of stdout."),
) -> None:
    """Print a public key (PEM) for agents to pin in trust.packages / trust.controllers."""
    pem = Keyring().public_pem(role, key_id)
    if out is None:
        typer.echo(pem, nl=False)
    else:
        out.write_text(pem)
        console.print(f"wrote {out}")


@keys_app.command("rotate")
def keys_rotate(
    ctx: typer.Context,
    role: str = typer.Argument("package", help="package or controller."),
    device: list[str] = typer.Option([], "--device", "-d", help="Send the rotation to this device now (repeatable)."),
    retire_old: bool = typer.Option(False, "--retire-old", help="Devices stop trusting the old key once they accept."),
) -> None:
    """Make a new active key for ROLE and a rotation statement signed by the old one (see docs/packages.md)."""
    ring = Keyring()
    old = ring.signing_key(role)
    kid = ring.rotate(role)
    retire = (key_id(old.public_key()),) if retire_old else ()
    rotation = KeyRotation(role, next_sequence(), time.time(), (ring.public_pem(role, kid),), retire)
    out = ring.root / role / f"rotation-{kid}.json"
    out.write_bytes(rotation.sign(old).to_bytes())
    console.print(f"new active {role} key {kid}; rotation signed by {key_id(old.public_key())} in {out}")
    if device:
        _send_rotation(ctx, out.read_bytes(), device)


def _send_rotation(ctx: typer.Context, envelope: bytes, devices: list[str]) -> None:
    """Publish a rotation on each device's commands topic; devices offline now need it sent again."""
    import queue

    from edgecore.protocol import topics
    from edgectl.cli.app import options
    from edgectl.config import load_edgectl_config
    from edgectl.connection import open_transport

    opts = options(ctx)
    transport = open_transport(opts.broker, load_edgectl_config(opts.config), queue.Queue())
    try:
        for d in devices:
            if not transport.publish(topics.device(d, "commands"), envelope, qos=1, wait=10.0):
                raise UserError(f"the broker did not acknowledge the rotation for {d}")
            console.print(f"sent rotation to {d}")
    finally:
        transport.close()


@app.command()
def build(
    model: Path = typer.Argument(..., exists=True, dir_okay=False, help="The ONNX model to package."),
    name: str = typer.Option(..., "--name", help="Model name; agents serve it under this name."),
    version: int = typer.Option(..., "--version", min=1, help="Integer version, higher than any before."),
    out: Path | None = typer.Option(None, "-o", "--out", help="Output path (default NAME-VERSION.edgepkg)."),
    target: str = typer.Option("any", "--target", help="Target profile the package is for ('any': every device)."),
    valid_days: float = typer.Option(90.0, "--valid-days", help="Days until the manifest expires."),
    chunk_size: int = typer.Option(64 * 1024, "--chunk-size", help="Transfer chunk size in bytes."),
    golden: Path | None = typer.Option(None, "--golden", file_okay=False,
                                       help="Folder of real input samples for the golden data (same formats as "
                                            "`quantize --calib`: .npy, .npz, JPEG/PNG)."),
    golden_samples: int = typer.Option(1, "--golden-samples", min=0,
                                       help="Samples in the golden data (stacked on the batch axis; 0: none)."),
    input_shape: list[str] = typer.Option([], "--input-shape",
                                          help="Shape of a dynamic input, NAME=1x3x640x640 (repeatable)."),
    preprocess: Path | None = typer.Option(None, "--preprocess", exists=True, dir_okay=False,
                                           help="YAML with image preprocessing for --golden images (as in quantize)."),
    memory_mb: int = typer.Option(8192, "--memory-mb", min=64,
                                  help="Address-space limit of the child that runs the model to record golden outputs."),
    timeout: float = typer.Option(300.0, "--timeout", min=1.0, help="Seconds that child may run."),
    as_json: bool = typer.Option(False, "--json", help="Print the manifest as JSON."),
    ort_out: Path | None = typer.Option(None, "--ort-out", file_okay=False,
                                        help="With --target nnapi: also write NAME.ort and the operator config of a "
                                             "reduced onnxruntime build for an Android app here, and ship model.ort in "
                                             "the package (docs/targets.md#android-and-nnapi)."),
) -> None:
    """Package MODEL with golden data into a signed .edgepkg (the model runs in a child under limits)."""
    from edgecore.feeds import parse_input_shapes
    from edgectl.package import Limits

    if ort_out is not None and target != "nnapi":
        raise UserError(f"--ort-out is for --target nnapi (an Android app's reduced onnxruntime), not {target!r}")
    out = out or Path(f"{name}-{version}.edgepkg")
    options = BuildOptions(name=name, version=version, target=_target_info(target), chunk_size=chunk_size, valid_days=valid_days,
                           golden_samples=golden_samples, golden_dir=golden, input_shapes=parse_input_shapes(input_shape),
                           preprocess=preprocess, limits=Limits(memory_mb, timeout), ort_dir=ort_out)
    manifest = build_package(model, options, Keyring().signing_key("package"), out)
    if as_json:
        import json

        print_json(json.loads(manifest.to_bytes()))
        return
    console.print(f"wrote {out}: {manifest.name} v{manifest.version} for target {manifest.target.name}, "
                  f"{manifest.payload.size} bytes in {len(manifest.payload.chunks)} chunks")
    if ort_out is not None:
        console.print(f"wrote {ort_out / (name + '.ort')} and {ort_out / (name + '.required_operators_and_types.config')}")


@pipeline_app.command("build")
def pipeline_build(
    spec: Path = typer.Argument(..., exists=True, dir_okay=False, help="The pipeline's YAML: models, steps, outputs."),
    version: int = typer.Option(..., "--version", min=1, help="Integer version, higher than any before."),
    name: str | None = typer.Option(None, "--name", help="Pipeline name (default: the YAML's 'name')."),
    out: Path | None = typer.Option(None, "-o", "--out", help="Output path (default NAME-VERSION.edgepkg)."),
    target: str = typer.Option("any", "--target", help="Target profile the package is for ('any': every device)."),
    valid_days: float = typer.Option(90.0, "--valid-days", help="Days until the manifest expires."),
    as_json: bool = typer.Option(False, "--json", help="Print the manifest as JSON."),
) -> None:
    """Package the pipeline in SPEC: its steps are checked against its models' packages, it runs once on onnxruntime's
    CPU, and its inputs and outputs become the golden data the device checks; signed like any package."""
    from edgectl.pipeline_package import PipelineOptions, build_pipeline

    ring = Keyring()
    key = ring.signing_key("package")
    trusted = TrustedKeys([load_public_key(ring.public_pem("package", r["key_id"])) for r in ring.list()
                           if r["role"] == "package"])
    options = PipelineOptions(name=name, version=version, target=_target_info(target), valid_days=valid_days)
    manifest, final = build_pipeline(spec, options, key, trusted, out)
    if as_json:
        import json

        print_json(json.loads(manifest.to_bytes()))
        return
    assert manifest.pipeline is not None
    console.print(f"wrote {final}: pipeline {manifest.name} v{manifest.version} over {', '.join(manifest.pipeline.models)}"
                  f" in {len(manifest.pipeline.steps)} steps, {manifest.payload.size} bytes")


def _target_info(name: str) -> TargetInfo:
    if name == "any":
        return TargetInfo("any")
    from targets import load_profile  # host-only: profiles and their providers

    profile = load_profile(name)
    return TargetInfo(profile.name, tuple(ep.name for ep in profile.execution_providers))


@app.command()
def verify(
    package: Path = typer.Argument(..., exists=True, dir_okay=False, help="The .edgepkg to check."),
    key: list[Path] = typer.Option([], "--key", help="Trusted public key PEM (repeatable); default: this machine's keys."),
    max_bytes: int = typer.Option(16 * 2**30, "--max-bytes", min=1, help="Refuse a payload larger than this many bytes."),
    as_json: bool = typer.Option(False, "--json", help="Print the verified manifest as JSON."),
) -> None:
    """Check a package as a device would: signature first, then expiry, payload and every file hash.

    Nothing is written before the signature is checked; sparse or oversized tar members are refused;
    what is written is bounded by the signed sizes, --max-bytes and the free space."""
    from edgecore.protocol.package import extract_payload

    ring = Keyring()
    pems = [p.read_text() for p in key] or [ring.public_pem("package", r["key_id"]) for r in ring.list()
                                            if r["role"] == "package"]
    if not pems:
        raise UserError("no trusted keys: pass --key PEM or run `edgectl keys init`")
    trusted = TrustedKeys([load_public_key(p) for p in pems])
    with tempfile.TemporaryDirectory(prefix="edgectl-verify-") as tmp:
        pkg = read_package(package, trusted, Path(tmp), max_bytes)
        pkg.manifest.check_fresh()
        extract_payload(pkg.payload, pkg.manifest, Path(tmp) / "files")
    m = pkg.manifest
    if as_json:
        import json

        print_json(json.loads(m.to_bytes()))
        return
    console.print(f"OK {package}: {m.name} v{m.version}, target {m.target.name}, signed by {pkg.envelope.signatures[0][0]}, "
                  f"{len(m.files)} files verified")
