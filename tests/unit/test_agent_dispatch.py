"""The agent daemon's message dispatch, run for real on an in-memory broker (no broker process, no sockets but its API)."""

from __future__ import annotations

import json
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
from edgecore.protocol import topics
from edgecore.protocol.envelope import COMMAND_TYPE, DESIRED_TYPE, TrustedKeys, sign
from edgecore.protocol.manifest import TargetInfo
from edgecore.protocol.messages import Command, DesiredModel, DesiredState
from edgecore.protocol.reports import DeviceEvent, Presence
from edgecore.transport import Message
from edgecore.transport_memory import MemoryBroker, MemoryTransport
from edgectl.examples import tiny_classifier
from edgectl.package import BuildOptions, build_package, read_package

DEVICE = "dev-1"
WAIT_S = 20.0  # a bound on waiting, not a timing claim: generous for a loaded 2-core CI run


def public_pem(key: Ed25519PrivateKey, path: Path) -> Path:
    path.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return path


@dataclass
class RunningAgent:
    """An Agent on a MemoryBroker, plus an observer that sees everything it publishes."""

    agent: Agent
    broker: MemoryBroker
    observer: MemoryTransport
    controller: MemoryTransport
    controller_key: Ed25519PrivateKey
    package_key: Ed25519PrivateKey
    seq: int = 1000

    def next(self, leaf: str, timeout: float = WAIT_S) -> Message:
        """The next message the agent published on ``leaf`` (others are skipped)."""
        deadline = time.monotonic() + timeout
        while True:
            message = self.observer.inbox.get(timeout=max(0.0, deadline - time.monotonic()))
            if message.topic == topics.device(DEVICE, leaf):
                return message

    def event(self) -> DeviceEvent:
        return DeviceEvent.from_payload(self.next("events").payload)

    def send(self, leaf: str, payload: bytes, retain: bool = False) -> None:
        assert self.controller.publish(topics.device(DEVICE, leaf), payload, qos=1, retain=retain)

    def desired(self, device_id: str = DEVICE, model: DesiredModel | None = None, seq: int | None = None,
                key: Ed25519PrivateKey | None = None, expires_in: float = 600.0) -> bytes:
        if seq is None:
            self.seq += 1
        now = time.time()
        state = DesiredState(device_id, seq or self.seq, now, now + expires_in, "d-test", model, {})
        return sign(DESIRED_TYPE, state.to_payload(), key or self.controller_key).to_bytes()

    def command(self, name: str, args: dict[str, Any] | None = None) -> bytes:
        self.seq += 1
        now = time.time()
        return sign(COMMAND_TYPE, Command(DEVICE, self.seq, now, now + 600, name, args or {}).to_payload(),
                    self.controller_key).to_bytes()


@pytest.fixture
def running(tmp_path: Path, stopping: list[threading.Thread]) -> Iterator[RunningAgent]:
    controller_key, package_key = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    config = AgentConfig(
        DEVICE, state_dir=tmp_path / "state", hardware_root=tmp_path / "hw", telemetry_interval_s=3600.0,
        trust=TrustSettings([public_pem(package_key, tmp_path / "package.pem")],
                            [public_pem(controller_key, tmp_path / "controller.pem")]),
        inference=InferenceSettings(port=0),
    )
    (tmp_path / "hw").mkdir()
    broker = MemoryBroker()
    observer = broker.transport("observer")
    observer.subscribe(f"{topics.ROOT}/devices/{DEVICE}/#")
    observer.connect()
    controller = broker.transport("controller")
    controller.connect()
    agent = Agent(config, transport=broker.factory(f"edge-agent-{DEVICE}"))
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    ra = RunningAgent(agent, broker, observer, controller, controller_key, package_key)
    assert Presence.from_payload(ra.next("presence").payload).online
    yield ra
    agent.stop()
    stopping.append(thread)


def test_announces_birth_presence_and_state_retained_on_connect(running: RunningAgent) -> None:
    for leaf in ("birth", "presence", "state"):
        retained = running.broker.retained(topics.device(DEVICE, leaf))
        assert retained is not None, leaf
    birth = json.loads(running.broker.retained(topics.device(DEVICE, "birth")) or b"")
    assert birth["device_id"] == DEVICE and birth["inference_url"] == running.agent.server.url


def test_signed_command_is_carried_out_and_reported(running: RunningAgent) -> None:
    running.send("commands", running.command("rollback"))
    event = running.event()
    assert (event.state, event.status, event.detail) == ("rollback", "ok", "nothing to roll back: no model is active")
    # The state announced on connect may still be on its way: wait for one that took the command.
    deadline = time.monotonic() + WAIT_S
    while json.loads(running.next("state", max(0.0, deadline - time.monotonic())).payload)["last_seq"] != running.seq:
        pass


def test_signed_desired_state_for_another_target_fails_its_deployment_with_the_reason(running: RunningAgent,
                                                                                         tmp_path: Path) -> None:
    onnx = tiny_classifier(tmp_path / "m.onnx", size=8)
    (tmp_path / "unpacked").mkdir()
    build_package(onnx, BuildOptions("m", 1, TargetInfo("jetson-orin"), golden_samples=0), running.package_key,
                  tmp_path / "m.edgepkg")
    package = read_package(tmp_path / "m.edgepkg", TrustedKeys([running.package_key.public_key()]), tmp_path / "unpacked")
    model = DesiredModel("m", 1, package.envelope)
    running.send("desired", running.desired(model=model), retain=True)
    events = [running.event()]
    while events[-1].state != "done":
        events.append(running.event())
    assert events[-1].status == "failed" and "package is for target 'jetson-orin'" in events[-1].detail
    assert all(e.deployment_id == "d-test" for e in events)


@pytest.mark.parametrize(("leaf", "payload", "reason"), [
    ("desired", b"\xff not json", "not JSON"),
    ("desired", b'{"payload_type": "x"}', "missing field 'payloadType'"),
    ("commands", b"[]", "expected a JSON object"),
    ("commands", b"{" * 10_000, "not JSON"),
])
def test_malformed_payloads_are_rejected_and_the_agent_keeps_going(running: RunningAgent, leaf: str, payload: bytes,
                                                                    reason: str) -> None:
    running.send(leaf, payload)
    event = running.event()
    assert (event.state, event.status) == ("rejected", "rejected") and reason in event.detail
    running.send("commands", running.command("rollback"))  # still alive, still dispatching
    assert running.event().state == "rollback"
    assert sum(running.agent.rejected.values()) == 1


def test_forged_misaddressed_replayed_and_expired_desired_states_are_rejected(running: RunningAgent) -> None:
    forged = running.desired(key=Ed25519PrivateKey.generate())
    elsewhere = running.desired(device_id="dev-2")
    expired = running.desired(expires_in=-1.0)
    accepted = running.desired()
    for payload in (forged, elsewhere, expired, accepted, accepted):
        running.send("desired", payload)
    details = [running.event().detail for _ in range(4)]
    assert "signature" in details[0].lower() or "key" in details[0].lower(), details[0]
    assert "addressed to dev-2" in details[1]
    assert "expired" in details[2]
    assert "replayed" in details[3]  # the accepted one (no model: keep what you have) gives no event, its replay does
    assert running.agent.ledger.last_seq == running.seq


def test_retained_desired_state_handed_back_on_reconnect_is_not_handled_twice(running: RunningAgent) -> None:
    running.send("desired", running.desired(), retain=True)
    running.broker.drop(f"edge-agent-{DEVICE}")
    assert not Presence.from_payload(running.next("presence").payload).online  # the will
    running.broker.start()
    assert Presence.from_payload(running.next("presence").payload).online
    running.send("commands", running.command("rollback"))
    assert running.event().state == "rollback"  # nothing in between: the retained copy was skipped silently
    assert not running.agent.rejected

