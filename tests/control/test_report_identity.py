"""A report whose body names another device than its topic is refused on every path that reads reports:
the controller service (every report kind, chunk requests included) and ``edgectl deploy --device``.

Both run for real on the in-memory broker (edgecore.transport_memory); the live case against Mosquitto
is in test_identity_and_limits.py.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgecore.protocol import topics
from edgecore.protocol.envelope import DESIRED_TYPE, TrustedKeys
from edgecore.protocol.messages import DesiredState, verify_signed
from edgecore.protocol.reports import (
    Birth,
    ChunkRequest,
    DeviceEvent,
    DeviceState,
    Presence,
    Report,
    RunningModel,
    Telemetry,
)
from edgecore.transport import Message
from edgecore.transport_memory import MemoryBroker
from edgectl.artifacts.chunk_server import ArtifactServer
from edgectl.controller import SqliteStore
from edgectl.controller.service import Controller
from edgectl.examples import tiny_classifier
from edgectl.fleet.direct import DeviceProgress, deploy_to_devices
from edgectl.package import BuildOptions, Package, build_package, read_package
from tests.fleet import wait_for
from tests.unit.test_controller_dispatch import connections

WAIT_S = 5.0


def impostures(victim: str) -> list[Report]:
    """One report of every kind about ``victim``, as another device would forge it."""
    now = time.time()
    return [Birth(victim, now, "0.1.0", "cpu-x86"), Presence(victim, False, now),
            DeviceState(victim, now, RunningModel("m", 9, "a" * 64)), Telemetry(victim, now),
            DeviceEvent(victim, "r-1", "done", "failed", "spoofed", now), ChunkRequest(victim, "a" * 64, [[0, 1]])]


@pytest.fixture
def controller(tmp_path: Path, stopping: list[threading.Thread]) -> Iterator[tuple[Controller, MemoryBroker, SqliteStore]]:
    broker = MemoryBroker()
    store = SqliteStore(tmp_path / "controller.db")
    key = Ed25519PrivateKey.generate()
    service = Controller(store, connections(broker, "controller"), key, TrustedKeys([key.public_key()]), tick_s=0.05)
    thread = threading.Thread(target=service.run, daemon=True)
    thread.start()
    wait_for(lambda: broker.subscribed("controller", topics.device("any", "telemetry")), WAIT_S,
             "the controller to subscribe", interval=0.01)
    yield service, broker, store
    service.stop()
    stopping.append(thread)


def test_the_controller_refuses_every_report_kind_about_another_device(
        controller: tuple[Controller, MemoryBroker, SqliteStore]) -> None:
    service, broker, store = controller
    rogue = broker.transport("dev-rogue")
    rogue.connect()
    forged = impostures("dev-victim")
    for report in forged:
        assert rogue.publish(topics.device("dev-rogue", report.LEAF), report.to_payload())
    wait_for(lambda: service.drops["identity"] == len(forged), WAIT_S, "every forged report counted", interval=0.01)
    assert store.devices() == [] and store.events("dev-victim") == [] and store.events("dev-rogue") == []
    assert service.server.requests == 0  # the forged chunk request never reached the artifact server

    honest = Birth("dev-rogue", time.time(), "0.1.0", "cpu-x86")  # positive control: its own report, on its own topic
    assert rogue.publish(topics.device("dev-rogue", "birth"), honest.to_payload())
    wait_for(lambda: [d.id for d in store.devices()] == ["dev-rogue"], WAIT_S, "the honest birth", interval=0.01)
    assert service.drops["identity"] == len(forged)


@pytest.fixture
def package(tmp_path: Path) -> tuple[Package, Ed25519PrivateKey]:
    package_key = Ed25519PrivateKey.generate()
    build_package(tiny_classifier(tmp_path / "m.onnx", size=8), BuildOptions("m", 1, golden_samples=0), package_key,
                  tmp_path / "m.edgepkg")
    (tmp_path / "unpacked").mkdir()
    return read_package(tmp_path / "m.edgepkg", TrustedKeys([package_key.public_key()]), tmp_path / "unpacked"), package_key


def test_deploy_to_a_device_refuses_events_and_chunk_requests_about_another_device(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, package: tuple[Package, Ed25519PrivateKey]) -> None:
    monkeypatch.setenv("EDGECTL_HOME", str(tmp_path / "home"))  # where signed messages take their sequence numbers
    broker, key = MemoryBroker(), Ed25519PrivateKey.generate()
    inbox: queue.Queue[Message] = queue.Queue()
    transport = broker.transport("edgectl", inbox)
    transport.connect()
    server = ArtifactServer(transport, expect_timeout_s=60.0).start()
    device = broker.transport("dev-a")
    device.subscribe(topics.device("dev-a", "desired"))
    device.connect()
    rogue = broker.transport("dev-x")
    rogue.connect()
    outcome: list[dict[str, DeviceProgress]] = []
    follow = threading.Thread(target=lambda: outcome.append(
        deploy_to_devices(transport, inbox, package[0], ["dev-a"], key, WAIT_S, server=server)[1]))
    follow.start()
    try:
        desired = DesiredState.from_payload(verify_signed(device.inbox.get(timeout=WAIT_S).payload,
                                                          TrustedKeys([key.public_key()]), DESIRED_TYPE))
        # dev-x forges dev-a's refusal (accepted whatever its deployment id) and dev-a's chunk request.
        now = time.time()
        rogue.publish(topics.device("dev-x", "events"), DeviceEvent("dev-a", "none", "rejected", "rejected", "spoofed", now)
                      .to_payload())
        artifact_id = package[0].manifest.artifact_id
        rogue.publish(topics.device("dev-x", "chunk-requests"), ChunkRequest("dev-a", artifact_id, [[0, 1]]).to_payload())
        # dev-a's own report, after the forged ones: the deployment must end on it.
        device.publish(topics.device("dev-a", "events"), DeviceEvent("dev-a", desired.deployment_id, "done", "ok",
                                                                     "committed", time.time()).to_payload())
        follow.join(WAIT_S * 2)
    finally:
        server.stop()
        transport.close()
    assert not follow.is_alive() and outcome
    progress = outcome[0]["dev-a"]
    assert (progress.status, progress.history) == ("ok", ["done"])  # the forged refusal never counted
    assert server.requests == 0  # nor the forged chunk request
