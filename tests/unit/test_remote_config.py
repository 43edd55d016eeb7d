"""The controller's configuration of an agent (agent/remote_config.py), on a real Agent over an in-memory broker."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agent.config import AgentConfig, InferenceSettings, TrustSettings
from agent.daemon import Agent
from edgecore.errors import ProtocolError
from edgecore.protocol import topics
from edgecore.protocol.device_config import CONFIG_TYPE, ConfigSettings
from edgecore.protocol.envelope import sign
from edgecore.protocol.reports import Birth, DeviceEvent, DeviceState
from edgecore.protocol.schema import encode_json
from edgecore.transport import Message
from edgecore.transport_memory import MemoryBroker, MemoryTransport

DEVICE = "dev-1"
WAIT_S = 20.0  # a bound on waiting, not a timing claim


@dataclass
class Rig:
    agent: Agent
    broker: MemoryBroker
    observer: MemoryTransport
    controller: MemoryTransport
    key: Ed25519PrivateKey
    config: AgentConfig

    def next(self, leaf: str) -> Message:
        deadline = time.monotonic() + WAIT_S
        while True:
            message = self.observer.inbox.get(timeout=max(0.0, deadline - time.monotonic()))
            if message.topic == topics.device(DEVICE, leaf):
                return message

    def event(self) -> DeviceEvent:
        return DeviceEvent.from_payload(self.next("events").payload)

    def send(self, version: int, settings: dict[str, Any], key: Ed25519PrivateKey | None = None,
             expires_in: float = 600.0, retain: bool = False) -> None:
        now = time.time()
        body = {"type": "config", "device_id": DEVICE, "version": version, "issued_at": now,
                "expires_at": now + expires_in, "settings": settings}
        raw = sign(CONFIG_TYPE, encode_json(body), key or self.key).to_bytes()
        assert self.controller.publish(topics.device(DEVICE, "config"), raw, qos=1, retain=retain)

    def state_with(self, version: int) -> DeviceState:
        while True:
            state = DeviceState.from_payload(self.next("state").payload)
            if state.config is not None and state.config.version == version:
                return state


def start(tmp_path: Path, key: Ed25519PrivateKey, stopping: list[threading.Thread], started: list[Agent]) -> Rig:
    pem = tmp_path / "controller.pem"
    pem.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    (tmp_path / "hw").mkdir(exist_ok=True)
    config = AgentConfig(DEVICE, state_dir=tmp_path / "state", hardware_root=tmp_path / "hw", telemetry_interval_s=3600.0,
                         tags={"site": "yaml", "room": "1"}, trust=TrustSettings([pem], [pem]),
                         inference=InferenceSettings(port=0, max_queue=64))
    broker = MemoryBroker()
    observer, controller = broker.transport("observer"), broker.transport("controller")
    observer.subscribe(f"{topics.ROOT}/devices/{DEVICE}/#")
    observer.connect()
    controller.connect()
    agent = Agent(config, transport=broker.factory(f"edge-agent-{DEVICE}"))
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    stopping.append(thread)
    started.append(agent)
    rig = Rig(agent, broker, observer, controller, key, config)
    rig.next("presence")
    return rig


@pytest.fixture
def started() -> Iterator[list[Agent]]:
    """The agents a test starts, stopped at its end; a configuration sets the root logger's level: pytest's is put back."""
    agents: list[Agent] = []
    level = logging.getLogger().level
    yield agents
    for agent in agents:
        agent.stop()
    logging.getLogger().setLevel(level)


def test_applies_refuses_and_keeps_the_old_one_across_a_restart(tmp_path: Path, stopping: list[threading.Thread],
                                                                started: list[Agent]) -> None:
    key = Ed25519PrivateKey.generate()
    rig = start(tmp_path, key, stopping, started)
    rig.send(1, {"telemetry_interval_s": 5, "log_level": "warning", "tags": {"site": "lab"}, "inference.max_queue": 3})
    event = rig.event()
    assert (event.state, event.status, event.data["version"]) == ("config", "applied", 1)
    assert rig.state_with(1).config == rig.agent.remote_config.status
    agent = rig.agent
    assert (agent.config.telemetry_interval_s, agent.config.log_level, agent.server.pool.limits.max_queue) == (5.0, "WARNING", 3)
    assert logging.getLogger().level == logging.WARNING
    birth = Birth.from_payload(rig.broker.retained(topics.device(DEVICE, "birth")) or b"")
    assert birth.tags == {"site": "lab", "room": "1"}  # merged over agent.yaml's: the remote one wins

    rig.send(2, {"inference.max_queue": -1})  # invalid: refused with the field, version 1 stays in force
    event = rig.event()
    assert event.status == "refused" and "settings.inference.max_queue" in event.detail
    state = rig.state_with(2)
    assert state.config is not None and (state.config.status.value, state.config.applied_version) == ("refused", 1)
    assert agent.server.pool.limits.max_queue == 3 and agent.config.telemetry_interval_s == 5.0

    rig.send(3, {"telemetry_interval_s": 2, "colour": "red"})  # an unknown key refuses the whole version
    assert "settings.colour" in rig.event().detail
    assert agent.config.telemetry_interval_s == 5.0

    agent.stop()
    rig = start(tmp_path, key, stopping, started)  # a restart: agent.yaml plus the saved version 1, status of version 3
    assert rig.agent.config.telemetry_interval_s == 5.0 and rig.agent.server.pool.limits.max_queue == 3
    state = DeviceState.from_payload(rig.next("state").payload)
    assert state.config is not None and (state.config.version, state.config.applied_version) == (3, 1)
    saved = json.loads((tmp_path / "state" / "config.json").read_text())
    assert saved["applied"]["version"] == 1


def test_replayed_forged_and_expired_configurations_change_nothing(tmp_path: Path, stopping: list[threading.Thread],
                                                                   started: list[Agent]) -> None:
    key = Ed25519PrivateKey.generate()
    rig = start(tmp_path, key, stopping, started)
    rig.send(5, {"telemetry_interval_s": 7})
    assert rig.event().status == "applied"
    rig.send(4, {"telemetry_interval_s": 9})  # an older version, live: a replay
    event = rig.event()
    assert event.status == "rejected" and "version 4 <= last handled 5" in event.detail
    rig.send(6, {"telemetry_interval_s": 9}, key=Ed25519PrivateKey.generate())
    assert rig.event().status == "rejected"
    rig.send(6, {"telemetry_interval_s": 9}, expires_in=-1)
    assert "expired" in rig.event().detail
    assert rig.agent.config.telemetry_interval_s == 7.0 and rig.agent.remote_config.status is not None
    assert rig.agent.remote_config.status.version == 5
    rig.send(6, {"telemetry_interval_s": 9})  # the same version re-signed with a fresh expiry is taken
    assert rig.event().status == "applied" and rig.agent.config.telemetry_interval_s == 9.0


@pytest.mark.parametrize(("settings", "field"), [
    ({"telemetry_interval_s": 0.5}, "settings.telemetry_interval_s"),
    ({"telemetry_interval_s": "10"}, "settings.telemetry_interval_s"),
    ({"log_level": "LOUD"}, "settings.log_level"),
    ({"tags": {"-bad": "x"}}, "settings.tags"),
    ({"tags": {"site": 3}}, "settings.tags.site"),
    ({"inference.max_queue": True}, "settings.inference.max_queue"),
    ({"broker": "mqtt://elsewhere"}, "settings.broker"),
])
def test_settings_are_checked_naming_the_field(settings: dict[str, Any], field: str) -> None:
    with pytest.raises(ProtocolError, match=field.replace(".", r"\.")):
        ConfigSettings.from_json(settings)
