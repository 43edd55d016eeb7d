"""``edgectl pki``, ``edgectl device enroll|revoke`` and ``edgectl broker config``: fleet identity."""

from __future__ import annotations

from pathlib import Path

import typer

from edgectl.broker_config import write_broker_config
from edgectl.cli.app import app
from edgectl.cli.broker import broker_app
from edgectl.pki import Algorithm, BundleTrust, FleetPki, default_pki_dir, enroll_device, parse_tags

__all__ = ["device_app", "pki_app"]

pki_app = typer.Typer(help="The fleet certificate authority: devices and the controller log in with its certificates.",
                      no_args_is_help=True)
device_app = typer.Typer(help="Enroll and revoke devices.", no_args_is_help=True)
app.add_typer(pki_app, name="pki")
app.add_typer(device_app, name="device")

_PKI_HELP = "PKI directory (default: $EDGECTL_HOME/pki)."


def _pki_dir(path: Path | None) -> Path:
    return path if path is not None else default_pki_dir()


def _say(message: str) -> None:
    typer.echo(message, err=True)


@pki_app.command("init")
def pki_init(
    directory: Path | None = typer.Option(None, "--dir", envvar="EDGECTL_PKI", help=_PKI_HELP),
    algorithm: Algorithm = typer.Option(
        Algorithm.P256, "--algorithm", case_sensitive=False,
        help="Key algorithm: p256 (default; works with every TLS stack and hardware key store) or ed25519.",
    ),
) -> None:
    """Create the fleet CA, the controller's certificate (CN=controller) and an empty revocation list."""
    pki = FleetPki.init(_pki_dir(directory), algorithm)
    _say(f"fleet CA ({algorithm.value}) in {pki.root}: keep {pki.ca_key_path.name} secret and backed up")
    _say(f"controller identity: {pki.controller_cert_path} + {pki.controller_key_path}")


@pki_app.command("crl")
def pki_crl(
    directory: Path | None = typer.Option(None, "--dir", envvar="EDGECTL_PKI", help=_PKI_HELP),
) -> None:
    """Re-sign the revocation list with a fresh expiry and copy it to every broker config."""
    pki = FleetPki.open(_pki_dir(directory))
    for path in pki.refresh_crl():
        _say(f"wrote {path}")
    _say(f"next update due {pki.crl().next_update_utc:%Y-%m-%d}: reload the brokers (SIGHUP) to load it")


@device_app.command("enroll")
def device_enroll(
    device_id: str = typer.Argument(..., metavar="ID", help="Device id (1-64 of A-Z a-z 0-9 . _ -); becomes the certificate CN."),
    tags: str = typer.Option("", "--tags", help="Tags for the agent config, e.g. site=lyon,line=3."),
    broker_url: str = typer.Option("mqtts://localhost:8883", "--broker-url", help="Broker URL the agent connects to (mqtts://host:port)."),
    out: Path | None = typer.Option(None, "--out", help="Bundle directory to write (default: ./ID)."),
    days: int = typer.Option(730, "--days", min=1, help="Days the device certificate is valid."),
    force: bool = typer.Option(False, "--force", help="Revoke a current certificate of ID and overwrite an existing bundle."),
    trust_packages: list[Path] | None = typer.Option(
        None, "--trust-package-key", help="PEM public key that signs packages; copied into the bundle (repeatable)."
    ),
    trust_controllers: list[Path] | None = typer.Option(
        None, "--trust-controller-key", help="PEM public key that signs commands; copied into the bundle (repeatable)."
    ),
    directory: Path | None = typer.Option(None, "--pki", envvar="EDGECTL_PKI", help=_PKI_HELP),
) -> None:
    """Issue a device certificate and key and write a ready agent config bundle (copy it to the device)."""
    tag_map = parse_tags(tags)
    trust = BundleTrust(packages=list(trust_packages or []), controllers=list(trust_controllers or []))
    pki = FleetPki.open(_pki_dir(directory))
    target = out if out is not None else Path(device_id)
    config = enroll_device(pki, device_id, target, broker_url, tag_map, days, trust=trust, force=force)
    _say(f"enrolled {device_id}: bundle in {target} (agent config {config}); device.key is secret")


@device_app.command("revoke")
def device_revoke(
    device_id: str = typer.Argument(..., metavar="ID", help="Device id to revoke."),
    directory: Path | None = typer.Option(None, "--pki", envvar="EDGECTL_PKI", help=_PKI_HELP),
) -> None:
    """Revoke a device's certificate: it is added to the CRL, which is copied to every broker config."""
    pki = FleetPki.open(_pki_dir(directory))
    if not pki.revoke(device_id):
        _say(f"{device_id} was already revoked")
        return
    for path in [pki.crl_path, *pki.crl_targets()]:
        _say(f"wrote {path}")
    _say("now reload the broker (SIGHUP; systemctl reload mosquitto) to refuse new connections, or restart it "
         "to also drop the device's live connection")


@broker_app.command("config")
def broker_config(
    out: Path = typer.Option(..., "--out", help="Directory for mosquitto.conf, acl, certificates and crl.pem."),
    port: int = typer.Option(8883, "--port", min=1, max=65535, help="TLS listener port."),
    hosts: list[str] | None = typer.Option(
        None, "--host", help="Name or IP clients use to reach the broker; repeat for several (default: localhost, 127.0.0.1)."
    ),
    bind: str | None = typer.Option(None, "--bind", help="Address to listen on (default: all)."),
    install_dir: Path | None = typer.Option(
        None, "--install-dir", help="Where these files will live on the broker host, if not --out (e.g. /etc/mosquitto/edgectl)."
    ),
    key_group: str = typer.Option("mosquitto", "--key-group", help="Group allowed to read broker.key (Mosquitto drops to it)."),
    directory: Path | None = typer.Option(None, "--pki", envvar="EDGECTL_PKI", help=_PKI_HELP),
) -> None:
    """Generate a Mosquitto 2 config for the fleet PKI: TLS, certificate login, per-device topic ACLs."""
    pki = FleetPki.open(_pki_dir(directory))
    written = write_broker_config(
        pki, out, port, hosts or ["localhost", "127.0.0.1"], install_dir=install_dir, bind=bind, key_group=key_group
    )
    _say(f"wrote {written.conf}, {written.acl}, broker.pem/.key for {', '.join(written.hosts)}, {written.crl}")
    if written.key_group is None:
        _say(f"note: make {out / 'broker.key'} readable by the user mosquitto runs as (mode 640, its group)")
    _say(f"run: mosquitto -c {written.conf}")
