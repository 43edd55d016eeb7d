"""A real controller (``edgectl controller run --http``) on a store of the test's own, a real Mosquitto, light agents.

Shared by the tests that take the controller's store away under it (test_store_outage.py,
test_store_failures.py): :func:`running_plane` starts the plane on any store URL (a PostgreSQL
database, a SQLite file on a small tmpfs); the ``plane`` fixture on a PostgreSQL cluster of the
test's own, which the test may stop, restart or turn read-only.
"""

from __future__ import annotations

import http.client
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from edgecore.protocol.envelope import TrustedKeys
from edgecore.protocol.manifest import TargetInfo
from edgectl.api.accounts import Accounts
from edgectl.controller.accounts import Role
from edgectl.controller.records import RolloutRow
from edgectl.controller.store import Store, open_url
from edgectl.controller.store.protocol import StoreUnavailable
from edgectl.examples import tiny_classifier
from edgectl.keys import Keyring
from edgectl.package import BuildOptions, build_package
from edgectl.sim import SimAgent, SimFleet
from tests.brokers import BrokerProcess, free_port, start_mosquitto
from tests.fleet import EdgectlHome, wait_for
from tests.postgres import PostgresCluster, start_cluster

__all__ = ["DEVICES", "Plane", "plane", "running_plane"]

DEVICES = 3


@dataclass
class Plane:
    url: str  # the controller's store: a postgresql:// URL or a SQLite file
    home: EdgectlHome
    port: int
    token: str  # an admin's
    process: subprocess.Popen[bytes]
    log: Path
    fleet: SimFleet
    cluster: PostgresCluster | None = None

    def call(self, path: str, token: bool = True, method: str = "GET", body: Any = None) -> tuple[int, bytes, dict[str, str]]:
        headers = {"Authorization": f"Bearer {self.token}"} if token else {}
        data = None if body is None else json.dumps(body).encode()
        if data is not None:
            headers["Content-Type"] = "application/json"
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=15)
        conn.request(method, path, body=data, headers=headers)
        answer = conn.getresponse()
        raw = answer.read()
        conn.close()
        return answer.status, raw, dict(answer.headers)

    def health(self) -> dict[str, Any]:
        return dict(json.loads(self.call("/api/v1/health", token=False)[1]))

    def metric(self, name: str, labels: str = "") -> float | None:
        """One series of ``/metrics`` (``labels`` as written there: ``reason="overflow"``); None when it is absent."""
        status, text, _ = self.call("/metrics", token=False)
        assert status == 200, text[:300]
        series = re.escape(name + (f"{{{labels}}}" if labels else ""))
        found = re.search(rb"^" + series.encode() + rb" (\S+)$", text, re.MULTILINE)
        return float(found.group(1)) if found else None

    def rollout(self, rollout_id: str) -> RolloutRow | None:
        """The rollout as the store holds it; None while the store does not answer (each look on a fresh connection)."""
        try:
            store = self.store()
        except StoreUnavailable:
            return None
        try:
            return store.rollout(rollout_id)
        except StoreUnavailable:
            return None
        finally:
            store.close()

    def store(self) -> Store:
        """The store on a connection of the test's own (close it)."""
        return open_url(self.url, packages_dir=self.home.path / "test-cache")

    def online(self, count: int) -> bool:
        store = self.store()
        try:
            return sum(bool(d.online) for d in store.devices()) == count
        finally:
            store.close()

    def deploy(self, version: int, bake: str = "3s") -> str:
        """``edgectl deploy`` of a tiny classifier at ``version`` to every device, in two waves; the rollout's id."""
        model = tiny_classifier(self.home.path / f"clf-{version}.onnx", seed=version)
        package = self.home.path / f"clf-{version}.edgepkg"
        build_package(model, BuildOptions("clf", version, TargetInfo("any"), golden_samples=0),
                      Keyring(self.home.path / "keys").signing_key("package"), package)
        result = self.home.edgectl("deploy", str(package), "--fleet", "all", "--waves", "1,100%", "--bake", bake, "--json",
                                   check=True)
        return str(json.loads(result.stdout)["rollout_id"])

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


@contextmanager
def running_plane(tmp_path: Path, home_for: Any, url: str, cluster: PostgresCluster | None = None) -> Iterator[Plane]:
    """The controller on the store at ``url`` (an admin and its token made first), Mosquitto, :data:`DEVICES` light agents."""
    broker: BrokerProcess = start_mosquitto(tmp_path / "mosquitto")
    home: EdgectlHome = home_for(tmp_path, broker)
    (home.path / "edgectl.yaml").write_text(json.dumps({"controller": {"store": url}, "api": {"metrics_open": True}}))
    store = open_url(url, packages_dir=tmp_path / "cache")
    accounts = Accounts(store)
    accounts.add_user("ann", Role.ADMIN, "test")
    token = accounts.create_token("ann", "", None, "test")[1]
    store.close()
    port = free_port()
    log = tmp_path / "controller.log"
    with log.open("wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "edgectl.cli.main", "controller", "run", "--http", f"127.0.0.1:{port}"],
                                   env=home.env(), cwd=home.path, stdout=out, stderr=subprocess.STDOUT)
    ring = Keyring(home.path / "keys")
    fleet = SimFleet(broker.url, TrustedKeys([ring.signing_key("package").public_key()]),
                     TrustedKeys([ring.signing_key("controller").public_key()]))
    found = Plane(url, home, port, token, process, log, fleet, cluster)
    try:
        for i in range(DEVICES):
            fleet.start(SimAgent(f"sim-{i:03d}", "cpu-x86", tmp_path / "sim" / f"sim-{i:03d}"))
        wait_for(lambda: found.online(DEVICES), 60, f"{DEVICES} devices online")
        yield found
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
        fleet.stop()
        broker.stop()


@pytest.fixture
def plane(tmp_path: Path, home_for: Any) -> Iterator[Plane]:
    """The plane on a PostgreSQL cluster of this test's own (it may stop it, restart it, turn it read-only)."""
    cluster = start_cluster()
    try:
        with running_plane(tmp_path, home_for, cluster.create_database(), cluster) as found:
            yield found
    finally:
        cluster.stop()
