"""Device configuration end to end in one process: the REST API stores it, the controller signs and publishes it, a real
agent applies it and reports it, and the API shows the two in sync; bad settings are a 400 naming the field, nothing stored.

The controller and the agent talk over an in-memory broker (edgecore.transport_memory); the API server is the real one on
the controller's SQLite store.
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agent.config import AgentConfig, InferenceSettings, TrustSettings
from agent.daemon import Agent
from edgecore.protocol.envelope import TrustedKeys
from edgecore.transport_memory import MemoryBroker
from edgectl.api.accounts import Accounts
from edgectl.api.app import api_context, api_routes
from edgectl.api.server import ApiServer
from edgectl.config import EdgectlConfig
from edgectl.controller.accounts import ROLES
from edgectl.controller.service import Controller
from edgectl.controller.store import SqliteStore
from tests.fleet import wait_for
from tests.unit.test_controller_dispatch import connections

DEVICE = "cam-1"
WAIT_S = 20.0  # a bound on waiting, not a timing claim


@dataclass
class Plane:
    server: ApiServer
    store: SqliteStore
    tokens: dict[str, str]
    agent: Agent

    def call(self, method: str, path: str, body: Any = None, role: str = "operator") -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {self.tokens[role]}", "Content-Type": "application/json"}
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.server.url}/api/v1{path}", data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())


@pytest.fixture
def plane(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stopping: list[threading.Thread]) -> Iterator[Plane]:
    monkeypatch.setenv("EDGECTL_HOME", str(tmp_path / "home"))
    key = Ed25519PrivateKey.generate()
    pem = tmp_path / "controller.pem"
    pem.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    broker = MemoryBroker()
    controller = Controller(SqliteStore(tmp_path / "store.db"), connections(broker, "controller"), key,
                            TrustedKeys([key.public_key()]), tick_s=0.05)
    (tmp_path / "hw").mkdir()
    agent = Agent(AgentConfig(DEVICE, state_dir=tmp_path / "state", hardware_root=tmp_path / "hw",
                              telemetry_interval_s=3600.0, trust=TrustSettings([pem], [pem]),
                              inference=InferenceSettings(port=0)), transport=broker.factory(f"edge-agent-{DEVICE}"))
    threads = [threading.Thread(target=controller.run, daemon=True), threading.Thread(target=agent.run, daemon=True)]
    for thread in threads:
        thread.start()
    store = SqliteStore(tmp_path / "store.db")
    accounts = Accounts(store)
    tokens = {}
    for role in ROLES:
        accounts.add_user(f"{role}-user", role, "test")
        tokens[role.value] = accounts.create_token(f"{role}-user", "", None, "test")[1]
    ctx = api_context(store, EdgectlConfig())
    server = ApiServer(ctx, api_routes(ctx), "127.0.0.1", 0).start()
    level = logging.getLogger().level
    yield Plane(server, store, tokens, agent)
    logging.getLogger().setLevel(level)
    server.stop()
    agent.stop()
    controller.stop()
    stopping.extend(threads)


def test_set_reaches_the_agent_and_shows_in_sync(plane: Plane) -> None:
    wait_for(lambda: plane.store.device(DEVICE) is not None, WAIT_S, "the agent's birth in the store")
    status, view = plane.call("PUT", f"/devices/{DEVICE}/config",
                              {"settings": {"telemetry_interval_s": 2, "log_level": "WARNING", "inference.max_queue": 5}})
    assert status == 200 and view["desired"]["version"] == 1 and view["sync"] in ("pending", "in sync")
    wait_for(lambda: plane.call("GET", f"/devices/{DEVICE}/config", role="viewer")[1]["sync"] == "in sync", WAIT_S,
             "the agent to report configuration v1")
    assert plane.agent.config.telemetry_interval_s == 2.0 and plane.agent.server.pool.limits.max_queue == 5

    status, view = plane.call("PUT", f"/devices/{DEVICE}/config", {"settings": {"tags": {"line": "3"}}})
    assert status == 200 and view["desired"]["version"] == 2
    wait_for(lambda: plane.call("GET", f"/devices/{DEVICE}/config")[1]["reported"]["applied_version"] == 2, WAIT_S,
             "the agent to report configuration v2")
    # A version is whole: the interval goes back to agent.yaml's, the tag is merged over agent.yaml's.
    assert plane.agent.config.telemetry_interval_s == 3600.0 and plane.agent.config.tags == {"line": "3"}
    detail = plane.call("GET", f"/devices/{DEVICE}", role="viewer")[1]
    assert detail["tags"] == {"line": "3"}
    audit = [(a.actor, a.detail) for a in plane.store.audit_log(device_id=DEVICE) if a.action == "device config set"]
    assert audit[-1] == ("api:operator-user", 'version 2: {"tags": {"line": "3"}}')


@pytest.mark.parametrize(("body", "field"), [
    ({"settings": {"inference.max_queue": -1}}, "settings.inference.max_queue"),
    ({"settings": {"telemetry_interval_s": "fast"}}, "settings.telemetry_interval_s"),
    ({"settings": {"log_level": "LOUD"}}, "settings.log_level"),
    ({"settings": {"tags": {"a b": "x"}}}, "settings.tags"),
    ({"settings": {"broker": "mqtt://elsewhere:1883"}}, "settings.broker"),
    ({"settings": {"maintenance_windows": ["daily 02:00-04:00", "weekly"]}}, "settings.maintenance_windows[1]"),
    ({"settings": {"maintenance_windows": "daily 02:00-04:00"}}, "settings.maintenance_windows"),
    ({"settings": []}, "settings"),
    ({}, "settings"),
    ({"settings": {}, "extra": 1}, "extra"),
])
def test_bad_settings_name_the_field_and_store_nothing(plane: Plane, body: dict[str, Any], field: str) -> None:
    wait_for(lambda: plane.store.device(DEVICE) is not None, WAIT_S, "the agent's birth in the store")
    status, answer = plane.call("PUT", f"/devices/{DEVICE}/config", body)
    assert (status, answer["error"]["field"]) == (400, field), answer
    assert plane.store.device_config(DEVICE) is None


def test_unknown_device_and_roles(plane: Plane) -> None:
    status, answer = plane.call("PUT", "/devices/nobody/config", {"settings": {"log_level": "DEBUG"}})
    assert status == 404 and "nobody" in answer["error"]["message"]
    assert plane.call("PUT", f"/devices/{DEVICE}/config", {"settings": {}}, role="viewer")[0] == 403
    assert plane.store.device_config("nobody") is None and plane.store.device_config(DEVICE) is None
    assert plane.call("GET", "/devices/nobody/config", role="viewer")[0] == 404
