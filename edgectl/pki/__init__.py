"""The fleet PKI: a CA, the controller's identity, device certificates and their revocation."""

from __future__ import annotations

from pathlib import Path

from edgectl.home import edgectl_home
from edgectl.pki.authority import CONTROLLER, FleetPki, IssuedIdentity
from edgectl.pki.bundle import BundleTrust, enroll_device, parse_tags, write_agent_bundle
from edgectl.pki.certs import Algorithm, Usage

__all__ = [
    "CONTROLLER",
    "Algorithm",
    "BundleTrust",
    "FleetPki",
    "IssuedIdentity",
    "Usage",
    "default_pki_dir",
    "enroll_device",
    "parse_tags",
    "write_agent_bundle",
]


def default_pki_dir() -> Path:
    """``$EDGECTL_HOME/pki``."""
    return edgectl_home() / "pki"
