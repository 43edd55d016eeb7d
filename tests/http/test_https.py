"""Artifacts over HTTPS: ``edgectl artifacts serve --tls-cert/--tls-key`` with a certificate from a fleet CA.

A real agent trusting that CA (``deploy.http_ca``) installs with every byte over HTTPS; an agent
trusting another CA refuses the server's certificate and gets the artifact over MQTT instead.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from edgecore.delivery.download import Download
from edgecore.delivery.http_fetch import HttpFetch, HttpSettings
from edgectl.artifacts.publish import export_payload
from edgectl.package import Package
from edgectl.pki.authority import FleetPki
from edgectl.pki.certs import Algorithm, Usage
from tests.checkout import checkout_env
from tests.deploy.controller import Controller
from tests.deploy.test_rejections import serves
from tests.fleet import AgentProcess, EdgectlHome
from tests.http.conftest import DEPLOY, desire


def _pki(root: Path) -> FleetPki:
    return FleetPki.init(root, Algorithm.P256)


@pytest.fixture
def fleet_ca(tmp_path: Path) -> FleetPki:
    return _pki(tmp_path / "pki")


@pytest.fixture
def https_serve(tmp_path: Path, fleet_ca: FleetPki) -> Iterator[Callable[[Path], str]]:
    """Factory: https_serve(directory) runs ``edgectl artifacts serve`` with a server certificate for 127.0.0.1; its URL."""
    started: list[subprocess.Popen[str]] = []

    def start(directory: Path) -> str:
        identity = fleet_ca.issue("artifacts", Usage.SERVER, 1, hosts=["127.0.0.1"])
        cert, key = tmp_path / "server.pem", tmp_path / "server.key"
        cert.write_bytes(identity.cert_pem)
        key.write_bytes(identity.key_pem)
        process = subprocess.Popen([sys.executable, "-m", "edgectl.cli.main", "artifacts", "serve", str(directory),
                                    "--port", "0", "--tls-cert", str(cert), "--tls-key", str(key)],
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   env=checkout_env(PYTHONUNBUFFERED="1"))
        started.append(process)
        assert process.stdout is not None
        line = process.stdout.readline()
        match = re.search(r"on (https://\S+?)/?$", line.strip())
        assert match, f"edgectl artifacts serve printed {line!r}"
        return match[1]

    yield start
    for process in started:
        process.terminate()
        process.wait(10)


def test_agent_installs_over_https_trusting_the_fleet_ca(
        home: EdgectlHome, controller: Controller, agents: Callable[..., AgentProcess], big_package: Package,
        fleet_ca: FleetPki, https_serve: Callable[[Path], str], tmp_path: Path) -> None:
    agent = agents(home, "s-1", extra={"deploy": {**DEPLOY, "http_ca": str(fleet_ca.ca_cert_path)}})
    base = https_serve(export_payload(big_package, tmp_path / "served").parent)
    controller.serving = False  # no chunk over MQTT: every byte must come over HTTPS
    deployment = desire(controller, "s-1", big_package, [f"{base}/{big_package.manifest.artifact_id}"])
    assert controller.final("s-1", deployment).status == "ok"
    assert serves(agent, "big", 1)
    assert controller.requests == []


def test_agent_refuses_a_server_of_another_ca_and_falls_back_to_mqtt(
        home: EdgectlHome, controller: Controller, agents: Callable[..., AgentProcess], big_package: Package,
        https_serve: Callable[[Path], str], tmp_path: Path) -> None:
    other = _pki(tmp_path / "other-pki")
    agent = agents(home, "s-2", extra={"deploy": {**DEPLOY, "http_ca": str(other.ca_cert_path)}})
    base = https_serve(export_payload(big_package, tmp_path / "served").parent)
    deployment = desire(controller, "s-2", big_package, [f"{base}/{big_package.manifest.artifact_id}"])
    assert controller.final("s-2", deployment).status == "ok"
    assert serves(agent, "big", 1)
    assert controller.requests, "the artifact came over MQTT"
    log = agent.log_text()
    assert "CERTIFICATE_VERIFY_FAILED" in log and "asking over MQTT" in log


@pytest.mark.parametrize("trusted", [True, False])
def test_http_fetch_checks_the_server_certificate(
        big_package: Package, fleet_ca: FleetPki, https_serve: Callable[[Path], str], tmp_path: Path,
        trusted: bool) -> None:
    """HttpSettings(ca_file=...), as deploy.http_ca and `edgectl sim --http-ca` set it: the fleet CA verifies, another
    CA refuses the server before any byte."""
    base = https_serve(export_payload(big_package, tmp_path / "served").parent)
    ca = fleet_ca.ca_cert_path if trusted else _pki(tmp_path / "other-pki").ca_cert_path
    download = Download(tmp_path / "downloads", big_package.manifest.payload)
    fetch = HttpFetch(HttpSettings(ca_file=ca))
    assert fetch.fetch(download, [f"{base}/{big_package.manifest.artifact_id}"]) is trusted
    assert fetch.bytes_received == (big_package.manifest.payload.size if trusted else 0)
