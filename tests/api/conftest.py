"""A real controller process serving the REST API (``controller run --http``), a real Mosquitto, light agents.

``api`` gives a :class:`ApiPlane`: the controller on a free port, users of each role with a token
(made with ``edgectl users add`` / ``tokens create``), a simulated fleet, and a small HTTP client.
Its store is SQLite; a test parametrized with ``@pytest.mark.parametrize("api", ENGINES, indirect=True)``
runs on PostgreSQL too (a database of its own in the tests' cluster, named in the home's edgectl.yaml).
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from edgecore.protocol.envelope import TrustedKeys
from edgectl.api.accounts import Accounts, parse_role
from edgectl.controller.store import open_url
from edgectl.keys import Keyring
from edgectl.sim import SimFleet
from tests.brokers import BrokerProcess, free_port
from tests.control.conftest import ControllerProcess, ControlPlane
from tests.fleet import EdgectlHome, wait_for
from tests.postgres import PostgresCluster, start_cluster

ROLES = ("viewer", "operator", "admin")
ENGINES = ("sqlite", "postgres")


@dataclass
class Answer:
    status: int
    body: Any
    headers: dict[str, str]


@dataclass
class ApiControllerProcess(ControllerProcess):
    """``edgectl controller run`` with extra arguments (``--http ADDR``)."""

    extra: list[str] = field(default_factory=list)

    def start(self) -> ApiControllerProcess:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen([sys.executable, "-m", "edgectl.cli.main", "controller", "run", *self.extra],
                                            env=self.home.env(), cwd=self.home.path, stdout=out, stderr=subprocess.STDOUT)
        return self


@dataclass
class ApiPlane(ControlPlane):
    port: int = 0
    tokens: dict[str, str] = field(default_factory=dict)
    store_url: str = ""  # the controller store's path or postgresql:// URL

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start_api(self, *extra: str) -> ControllerProcess:
        self.port = free_port()
        self.process = ApiControllerProcess(self.home, self.home.path.parent / "controller.log",
                                            extra=["--http", f"127.0.0.1:{self.port}", *extra]).start()
        try:  # a loaded 2-core box can take a while to import and start the controller
            wait_for(lambda: self._healthy(), 120, "the controller's API")
        except AssertionError as exc:
            log = self.process.log.read_text(errors="replace")[-3000:] if self.process.log.exists() else "(no log)"
            raise AssertionError(f"{exc}; controller log:\n{log}") from None
        return self.process

    def _healthy(self) -> bool:
        try:
            return self.call("GET", "/api/v1/health", token=None).status == 200
        except OSError:
            return False

    def add_user(self, name: str, role: str) -> str:
        self.edgectl("users", "add", name, "--role", role, check=True)
        token: str = json.loads(self.edgectl("tokens", "create", name, "--json", check=True).stdout)["token"]
        return token

    def call(self, method: str, path: str, body: Any = None, token: str | None = "operator", raw: bytes | None = None,
             headers: dict[str, str] | None = None) -> Answer:
        """One request; ``token`` is a role name (its user's token), a literal token, or None (no header)."""
        sent = dict(headers or {})
        if token is not None:
            sent["Authorization"] = f"Bearer {self.tokens.get(token, token)}"
        data = raw if raw is not None else None if body is None else json.dumps(body).encode()
        if raw is not None:
            sent.setdefault("Content-Type", "application/octet-stream")
        elif body is not None:
            sent["Content-Type"] = "application/json"
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=sent)
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return _answer(response.status, response.read(), dict(response.headers))
        except urllib.error.HTTPError as exc:
            return _answer(exc.code, exc.read(), dict(exc.headers))


def _answer(status: int, raw: bytes, headers: dict[str, str]) -> Answer:
    kind = headers.get("Content-Type", "")
    return Answer(status, json.loads(raw) if kind.startswith("application/json") and raw else raw, headers)


def _seed_accounts(store_url: str, packages: Path) -> dict[str, str]:
    """One user and token per role, made in process (``edgectl users``/``tokens`` have tests of their own):
    six CLI runs per test cost more than the test."""
    store = open_url(store_url, packages_dir=packages)
    try:
        accounts = Accounts(store)
        tokens = {}
        for role in ROLES:
            accounts.add_user(f"{role}-user", parse_role(role), "test")
            tokens[role] = accounts.create_token(f"{role}-user", "test", None, "test")[1]
        return tokens
    finally:
        store.close()


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresCluster]:
    cluster = start_cluster()
    yield cluster
    cluster.stop()


@pytest.fixture
def api(request: pytest.FixtureRequest, tmp_path: Path, mosquitto: BrokerProcess, home_for: Any) -> Iterator[ApiPlane]:
    home: EdgectlHome = home_for(tmp_path, mosquitto)
    store_url = str(home.path / "controller.db")
    if getattr(request, "param", "sqlite") == "postgres":
        cluster: PostgresCluster = request.getfixturevalue("postgres")
        store_url = cluster.create_database()
        (home.path / "edgectl.yaml").write_text(json.dumps({"controller": {"store": store_url}}))
    ring = Keyring(home.path / "keys")
    fleet = SimFleet(mosquitto.url, TrustedKeys([ring.signing_key("package").public_key()]),
                     TrustedKeys([ring.signing_key("controller").public_key()]))
    plane = ApiPlane(home, mosquitto, home.path / "controller.db", fleet, store_url=store_url)
    plane.tokens = _seed_accounts(store_url, home.path / "packages")
    plane.start_api()
    yield plane
    plane.stop_controller()
    fleet.stop()
