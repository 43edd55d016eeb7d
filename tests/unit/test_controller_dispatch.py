"""The controller service's ingest and publishing, run for real on an in-memory broker."""

from __future__ import annotations

import itertools
import json
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgecore.protocol import topics
from edgecore.protocol.envelope import DESIRED_TYPE, MANIFEST_TYPE, Envelope, TrustedKeys
from edgecore.protocol.manifest import Manifest
from edgecore.protocol.messages import DesiredState, verify_signed
from edgecore.protocol.reports import DeviceEvent, Presence
from edgecore.protocol.schema import encode_json
from edgecore.transport import ConnectHook, Message, Transport, TransportFactory
from edgecore.transport_memory import MemoryBroker, MemoryTransport
from edgectl.controller import RolloutOptions, SqliteStore, plan_rollout, submit_rollout
from edgectl.controller.service import ACK, Controller
from edgectl.examples import tiny_classifier
from edgectl.package import BuildOptions, build_package, read_package
from tests.fleet import wait_for

WAIT_S = 3.0


@dataclass
class RunningController:
    """A Controller on a MemoryBroker, the path of its store, and light devices to talk to it."""

    controller: Controller
    broker: MemoryBroker
    store_path: Path
    key: Ed25519PrivateKey
    package_key: Ed25519PrivateKey

    def store(self) -> SqliteStore:
        return SqliteStore(self.store_path)

    def device(self, device_id: str, target: str = "cpu-x86") -> MemoryTransport:
        """A connected device that announced itself (birth, presence) and listens to its desired state."""
        device = self.broker.transport(f"device-{device_id}")
        device.subscribe(topics.device(device_id, "desired"))
        device.connect()
        birth = {"device_id": device_id, "agent_version": "test", "ts": time.time(), "hardware": {}, "runtimes": {},
                 "target": target, "tags": {}, "inference_url": None}
        device.publish(topics.device(device_id, "birth"), encode_json(birth), retain=True)
        device.publish(topics.device(device_id, "presence"), Presence(device_id, True, time.time()).to_payload(), retain=True)
        return device

    def event(self, device: MemoryTransport, device_id: str, deployment_id: str, state: str, status: str) -> None:
        event = DeviceEvent(device_id, deployment_id, state, status, "", time.time(), {})
        assert device.publish(topics.device(device_id, "events"), event.to_payload())

    def events(self, device_id: str) -> list[tuple[str, str]]:
        return [(e.state, e.status) for e in self.store().events(device_id)]


def next_desired(device: MemoryTransport, timeout: float = WAIT_S) -> Message:
    """The next desired state, past the empty ones that acknowledge a device's birth (service.ACK)."""
    while True:
        message = device.inbox.get(timeout=timeout)
        assert message.topic.endswith("/desired"), message.topic
        if json.loads(Envelope.from_bytes(message.payload).payload)["deployment_id"] != ACK:
            return message


def connections(broker: MemoryBroker, client_id: str) -> TransportFactory:
    """The controller's transports on ``broker``: ``client_id``, then ``client_id-1``, ``-2``... for the later connections.

    A client id of its own per connection, as ``controller_transports`` makes them (see ``TransportFactory``): the
    controller opens a second one to read the retained reports (reconciliation), which must not take over the first."""
    names = itertools.count()

    def build(inbox: queue.Queue[Message], on_connect: ConnectHook) -> Transport:
        n = next(names)
        return broker.transport(f"{client_id}-{n}" if n else client_id, inbox, on_connect)

    return build


@pytest.fixture
def running(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stopping: list[threading.Thread]) -> Iterator[RunningController]:
    monkeypatch.setenv("EDGECTL_HOME", str(tmp_path / "home"))  # where signed messages take their sequence numbers
    key, package_key = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    broker = MemoryBroker()
    store_path = tmp_path / "controller.db"
    controller = Controller(SqliteStore(store_path), connections(broker, "controller"), key,
                            TrustedKeys([package_key.public_key()]), tick_s=0.05)
    thread = threading.Thread(target=controller.run, daemon=True)
    thread.start()
    wait_for(lambda: broker.subscribed("controller", topics.device("any", "telemetry")), WAIT_S,
             "the controller to subscribe", interval=0.01)
    yield RunningController(controller, broker, store_path, key, package_key)
    controller.stop()
    assert thread.is_alive(), "the controller died during the test"
    stopping.append(thread)


def test_device_reports_are_ingested_into_the_store(running: RunningController) -> None:
    device = running.device("dev-1", target="jetson-orin")
    report = {"device_id": "dev-1", "ts": time.time(), "device": {"cpu_percent": 5.0},
              "models": {"m": {"version": "3", "backend": "onnxruntime/CPUExecutionProvider", "latency_ms": {"p95": 4.5}}}}
    device.publish(topics.device("dev-1", "telemetry"), encode_json(report), qos=0)
    running.event(device, "dev-1", "d-1", "download", "running")
    wait_for(lambda: running.events("dev-1"), WAIT_S, "the event in the store", interval=0.01)
    row = running.store().device("dev-1")
    assert row is not None and row.online and row.birth is not None and row.birth.target == "jetson-orin"
    assert row.telemetry is not None and row.telemetry.models["m"].latency_ms.p95 == 4.5
    assert running.events("dev-1") == [("download", "running")]


@pytest.mark.parametrize("leaf", ["birth", "presence", "state", "telemetry", "events", "chunk-requests"])
def test_malformed_reports_are_dropped_and_the_controller_goes_on(running: RunningController, leaf: str) -> None:
    sender = running.broker.transport("bad-device")
    sender.connect()
    for payload in (b"\xff\xfe", b"[]", b'{"device_id": "dev-bad"}', b"{" * 5000):
        assert sender.publish(topics.device("dev-bad", leaf), payload)
    device = running.device("dev-1")
    running.event(device, "dev-1", "d-1", "download", "running")  # queued behind the bad ones
    wait_for(lambda: running.events("dev-1"), WAIT_S, "the good event after the bad ones", interval=0.01)
    assert running.store().events("dev-bad") == []
    if leaf != "birth":  # a birth carries no schema of its own beyond being a JSON object
        assert running.store().device("dev-bad") is None


def test_a_rollout_publishes_signed_desired_states_and_again_after_a_broker_restart(running: RunningController,
                                                                                     tmp_path: Path) -> None:
    devices = {d: running.device(d) for d in ("dev-1", "dev-2")}
    wait_for(lambda: len(running.store().devices()) == 2, WAIT_S, "both devices in the store", interval=0.01)
    onnx = tiny_classifier(tmp_path / "m.onnx", size=8)
    build_package(onnx, BuildOptions("m", 1, golden_samples=0), running.package_key, tmp_path / "m.edgepkg")
    (tmp_path / "unpacked").mkdir()
    package = read_package(tmp_path / "m.edgepkg", TrustedKeys([running.package_key.public_key()]), tmp_path / "unpacked")
    rows: list[dict[str, Any]] = [{"device_id": d, "target": "cpu-x86", "status": "online"} for d in devices]
    plan = plan_rollout(rows, [package], "100%", 0.0)
    rollout_id = submit_rollout(running.store(), plan, RolloutOptions("*", 0.5, 0.0, []))

    controller_keys, package_keys = TrustedKeys([running.key.public_key()]), TrustedKeys([running.package_key.public_key()])
    for device_id, device in devices.items():
        message = next_desired(device)
        desired = DesiredState.from_payload(verify_signed(message.payload, controller_keys, DESIRED_TYPE))
        assert (desired.device_id, desired.deployment_id) == (device_id, rollout_id)
        assert desired.model is not None
        manifest = Manifest.from_bytes(package_keys.verify(desired.model.manifest, MANIFEST_TYPE))
        assert (manifest.name, manifest.version) == ("m", 1)

    running.broker.stop()  # Mosquitto without persistence: the retained desired states are gone
    running.broker.start()
    for device_id, device in devices.items():
        again = next_desired(device)  # republished from the store, not from the broker's memory
        assert DesiredState.from_payload(verify_signed(again.payload, controller_keys, DESIRED_TYPE)).device_id == device_id
        assert running.broker.retained(topics.device(device_id, "desired")) == again.payload

    for device_id, device in devices.items():
        running.event(device, device_id, rollout_id, "done", "ok")
    wait_for(lambda: all(r.status == "ok" for r in running.store().rollout_devices(rollout_id)), WAIT_S,
             "both devices ok in the rollout", interval=0.01)
