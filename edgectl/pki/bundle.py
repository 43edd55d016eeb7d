"""The agent config bundle that ``edgectl device enroll`` writes for one device."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from edgecore.errors import ConfigError, UserError
from edgectl.pki.authority import FleetPki, IssuedIdentity, write_file

__all__ = ["BundleTrust", "enroll_device", "parse_tags", "write_agent_bundle"]

CA_FILE = "ca.pem"
CERT_FILE = "device.pem"
KEY_FILE = "device.key"
CONFIG_FILE = "agent.yaml"


@dataclass(frozen=True)
class BundleTrust:
    """Public keys (PEM files) the agent trusts to sign packages and commands; copied into the bundle."""

    packages: list[Path] = field(default_factory=list)
    controllers: list[Path] = field(default_factory=list)

    def check(self) -> None:
        for path in [*self.packages, *self.controllers]:
            if not path.is_file():
                raise ConfigError(f"trusted public key {path} does not exist")

    def write(self, out: Path) -> dict[str, list[str]]:
        """Copy the keys to ``out/trust/<role>-<n>.pem``; return the agent.yaml ``trust`` section."""
        section: dict[str, list[str]] = {}
        for role, paths in (("packages", self.packages), ("controllers", self.controllers)):
            for n, path in enumerate(paths):
                name = f"trust/{role}-{n}.pem"
                write_file(out / name, path.read_bytes())
                section.setdefault(role, []).append(name)
        return section


def parse_tags(text: str) -> dict[str, str]:
    """``k=v,k2=v2`` -> mapping; an empty string is no tags."""
    tags: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"bad tag {item!r} in --tags: expected key=value")
        tags[key.strip()] = value.strip()
    return tags


def check_broker_url(url: str) -> str:
    """Return ``url`` if it is ``mqtts://host[:port]``: certificates only make sense over TLS."""
    parts = urlsplit(url)
    try:
        _ = parts.port  # reading it validates it
    except ValueError:
        raise ConfigError(f"bad port in broker URL {url!r}") from None
    if parts.scheme != "mqtts" or not parts.hostname:
        raise ConfigError(f"broker URL {url!r} must look like mqtts://host:8883 (TLS with certificates)")
    return url


def _check_target(out: Path, force: bool) -> None:
    if (out / KEY_FILE).exists() and not force:
        raise UserError(f"{out / KEY_FILE} already exists: choose another --out or pass --force")


def enroll_device(
    pki: FleetPki,
    device_id: str,
    out: Path,
    broker_url: str,
    tags: dict[str, str],
    days: int,
    trust: BundleTrust = BundleTrust(),
    force: bool = False,
) -> Path:
    """Enroll ``device_id`` and write its bundle to ``out``; every input is checked before issuing."""
    check_broker_url(broker_url)
    trust.check()
    _check_target(out, force)
    identity = pki.enroll(device_id, days, force=force)
    return write_agent_bundle(out, identity, pki.ca_cert_path.read_bytes(), broker_url, tags, trust, force=True)


def write_agent_bundle(
    out: Path,
    identity: IssuedIdentity,
    ca_pem: bytes,
    broker_url: str,
    tags: dict[str, str],
    trust: BundleTrust = BundleTrust(),
    force: bool = False,
) -> Path:
    """Write ca.pem, device.pem, device.key (0600), trusted keys and agent.yaml into ``out``."""
    check_broker_url(broker_url)
    trust.check()
    _check_target(out, force)
    out.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_file(out / CA_FILE, ca_pem)
    write_file(out / CERT_FILE, identity.cert_pem)
    write_file(out / KEY_FILE, identity.key_pem, 0o600)
    # Paths are relative to agent.yaml so the bundle can be copied anywhere on the device.
    config: dict[str, Any] = {
        "device_id": identity.name,
        "broker": broker_url,
        "tls": {"ca": CA_FILE, "cert": CERT_FILE, "key": KEY_FILE},
        "tags": tags,
    }
    trust_section = trust.write(out)
    if trust_section:
        config["trust"] = trust_section
    write_file(out / CONFIG_FILE, yaml.safe_dump(config, sort_keys=False).encode(), 0o600)
    return out / CONFIG_FILE
