"""Artifact commands: ``artifacts serve`` (a directory over HTTP(S) with Range) and ``artifacts publish``."""

from __future__ import annotations

import dataclasses
import signal
import ssl
import tempfile
from pathlib import Path
from types import FrameType

import typer

from edgecore.errors import UserError
from edgectl.artifacts import RangeServer
from edgectl.artifacts.publish import S3Location, export_payload, publish_s3
from edgectl.artifacts.range_server import ORIGIN_LIMITS
from edgectl.cli.app import app
from edgectl.cli.output import console, print_json
from edgectl.controller.gates import parse_duration
from edgectl.fleet import load_package

artifacts_app = typer.Typer(help="Serve or publish package payloads for devices to fetch by HTTP(S).", no_args_is_help=True)
app.add_typer(artifacts_app, name="artifacts")


@artifacts_app.command("serve")
def serve(
    directory: Path = typer.Argument(..., exists=True, file_okay=False, help="Directory to serve (no listing, no way out)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0: every interface)."),
    port: int = typer.Option(8090, "--port", min=0, max=65535, help="Port (0: a free one, printed)."),
    tls_cert: Path | None = typer.Option(None, "--tls-cert", exists=True, dir_okay=False, help="Serve HTTPS with this PEM."),
    tls_key: Path | None = typer.Option(None, "--tls-key", exists=True, dir_okay=False, help="Private key of --tls-cert."),
    rate: int | None = typer.Option(None, "--rate", min=1, help="Bytes/s per response (default: as fast as it goes)."),
    max_connections: int = typer.Option(ORIGIN_LIMITS.max_connections, "--max-connections", min=1,
                                        help="Open connections in all (also capped by the descriptor limit)."),
    per_address: int = typer.Option(ORIGIN_LIMITS.max_per_address, "--max-per-address", min=1,
                                    help="Open connections from one client address (devices behind one NAT share one)."),
    header_timeout: float = typer.Option(ORIGIN_LIMITS.header_timeout_s, "--header-timeout", min=0.1,
                                         help="Seconds a client has to send a request's head (then 408 and closed)."),
) -> None:
    """Serve DIRECTORY's files with HTTP Range (206/416, HEAD) until interrupted.

    Connections are bounded: a head must arrive within --header-timeout, an idle keep-alive ends after 15 s, a TLS
    handshake within 10 s; over --max-connections or --max-per-address a client gets 503 (docs/security.md, Servers)."""
    if (tls_cert is None) != (tls_key is None):
        raise UserError("--tls-cert and --tls-key go together")
    context = None
    if tls_cert is not None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(tls_cert, tls_key)
    limits = dataclasses.replace(ORIGIN_LIMITS, max_connections=max_connections, max_per_address=per_address,
                                 header_timeout_s=header_timeout)
    try:
        server = RangeServer(directory, host, port, context, rate, limits)
    except OSError as exc:
        raise UserError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc

    def stop(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    print(f"serving {directory} on {server.url}/", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


@artifacts_app.command("publish")
def publish(
    packages: list[Path] = typer.Argument(..., exists=True, dir_okay=False, help="Signed PKG.edgepkg file(s)."),
    directory: Path | None = typer.Option(None, "--dir", file_okay=False, help="Copy payloads into this directory."),
    base_url: str | None = typer.Option(None, "--base-url", help="With --dir: the URL the directory is served at."),
    s3: str | None = typer.Option(None, "--s3", help="Upload to s3://BUCKET or s3://BUCKET/PREFIX."),
    endpoint: str | None = typer.Option(None, "--endpoint", help="S3-compatible endpoint URL (default: AWS)."),
    region: str | None = typer.Option(None, "--region", help="S3 region (default: us-east-1)."),
    expires: str = typer.Option("168h", "--expires", help="Lifetime of presigned URLs: 30m, 24h (at most 168h)."),
    plain: bool = typer.Option(False, "--plain", help="Print plain object URLs (a public bucket or CDN), not presigned ones."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Publish each package's payload under its artifact id; print the URL(s) for `deploy --artifact-url`."""
    if (directory is None) == (s3 is None):
        raise UserError("give either --dir DIRECTORY or --s3 s3://BUCKET[/PREFIX]")
    location = S3Location.parse(s3) if s3 is not None else None
    presign_s = None if plain else int(parse_duration(expires, "--expires"))
    rows = []
    with tempfile.TemporaryDirectory(prefix="edgectl-publish-") as tmp:
        for i, path in enumerate(packages):
            (Path(tmp) / str(i)).mkdir()
            package = load_package(path, None, None, Path(tmp) / str(i))
            artifact = package.manifest.artifact_id
            if location is not None:
                url = publish_s3(package, location, endpoint, region, presign_s)
            else:
                assert directory is not None
                out = export_payload(package, directory)
                url = f"{base_url.rstrip('/')}/{artifact}" if base_url else str(out)
            rows.append({"package": str(path), "artifact_id": artifact, "url": url})
    if as_json:
        print_json(rows)
        return
    for row in rows:
        console.print(f"{row['package']}: {row['artifact_id'][:12]}", highlight=False)
        print(row["url"], flush=True)  # whole, unwrapped: a presigned URL is long
