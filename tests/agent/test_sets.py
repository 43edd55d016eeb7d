"""Desired sets on the device (issue 22), run for real on an in-memory broker: real Agent, real onnxruntime, real files.

Schema negotiation (the birth, schema 1 as the set of its model, a schema the agent does not speak),
admission refusals with their numbers (before anything is touched, and again once staging measured
the new models), one model updated or removed without touching the other, per-model rollback.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agent.config import AgentConfig, DeploySettings, InferenceSettings, ModelsSettings, TrustSettings
from agent.daemon import Agent
from edgecore.protocol import topics
from edgecore.protocol.envelope import COMMAND_TYPE, DESIRED_TYPE, TrustedKeys, sign
from edgecore.protocol.messages import Command, DeployOptions, DesiredModel, DesiredSet, DesiredState
from edgecore.protocol.reports import Birth, ChunkRequest, DeviceEvent, DeviceState, Presence, read_report
from edgecore.transport import Message
from edgecore.transport_memory import MemoryBroker, MemoryTransport
from edgectl.artifacts.chunk_server import ArtifactServer, ServedArtifact
from edgectl.examples import tiny_classifier
from edgectl.package import BuildOptions, Package, build_package, read_package
from tests.pump import InboxPump
from tests.unit.test_agent_dispatch import public_pem

DEVICE = "set-1"
WAIT_S = 60.0


@dataclass
class SetDevice:
    """An Agent on a MemoryBroker; ``events`` collects what it reports, ``send_*`` sign as its controller."""

    agent: Agent
    broker: MemoryBroker
    controller: MemoryTransport
    controller_key: Ed25519PrivateKey
    package_key: Ed25519PrivateKey
    work: Path
    server: ArtifactServer
    events: list[DeviceEvent] = field(default_factory=list)
    seq: int = 1000

    def package(self, name: str, version: int, seed: int = 0) -> Package:
        out = self.work / f"{name}-{version}-{seed}.edgepkg"
        build_package(tiny_classifier(self.work / f"{name}-{version}-{seed}.onnx", size=8, seed=seed),
                      BuildOptions(name, version, golden_samples=0), self.package_key, out)
        (self.work / out.stem).mkdir()
        package = read_package(out, TrustedKeys([self.package_key.public_key()]), self.work / out.stem)
        m = package.manifest  # its chunks answered over MQTT, as the controller's artifact server does
        self.server.serve(ServedArtifact(m.artifact_id, package.payload, m.payload.chunk_size, len(m.payload.chunks)))
        return package

    def send(self, payload: bytes, leaf: str = "desired") -> None:
        assert self.controller.publish(topics.device(DEVICE, leaf), payload, qos=1, retain=leaf == "desired")

    def desired_set(self, entries: list[tuple[Package, str]], deployment_id: str = "d-set") -> None:
        self.seq += 1
        now = time.time()
        models = tuple(DesiredModel(p.manifest.name, p.manifest.version, p.envelope, (), d, DeployOptions())
                       for p, d in entries)
        message = DesiredSet(DEVICE, self.seq, now, now + 600, deployment_id, models)
        self.send(sign(DESIRED_TYPE, message.to_payload(), self.controller_key).to_bytes())

    def command(self, name: str, **args: str) -> None:
        self.seq += 1
        now = time.time()
        message = Command(DEVICE, self.seq, now, now + 600, name, dict(args))
        self.send(sign(COMMAND_TYPE, message.to_payload(), self.controller_key).to_bytes(), "commands")

    def wait(self, found: Callable[[DeviceEvent], bool], what: str) -> DeviceEvent:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            event = next((e for e in list(self.events) if found(e)), None)
            if event is not None:
                return event
            time.sleep(0.05)
        got = [(e.deployment_id, e.model, e.state, e.status, e.detail[:80]) for e in self.events]
        raise AssertionError(f"no event: {what}; got {got}")

    def done(self, deployment_id: str, model: str) -> DeviceEvent:
        return self.wait(lambda e: e.deployment_id == deployment_id and e.model == model and e.state == "done",
                         f"{model} done under {deployment_id}")

    def state(self) -> DeviceState:
        raw = self.broker.retained(topics.device(DEVICE, "state"))
        assert raw is not None
        return DeviceState.from_payload(raw)

    def served(self) -> dict[str, str]:
        return {name: self.agent.registry.get(name).version for name in self.agent.registry.names()}


@pytest.fixture
def device(tmp_path: Path, stopping: list[threading.Thread]) -> Iterator[Callable[..., SetDevice]]:
    """Factory: device(budget_mb=None) starts an agent with that admission budget."""
    started: list[tuple[Agent, threading.Thread]] = []
    servers: list[tuple[ArtifactServer, InboxPump]] = []

    def start(budget_mb: float | None = None) -> SetDevice:
        controller_key, package_key = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
        (tmp_path / "hw").mkdir()
        config = AgentConfig(
            DEVICE, state_dir=tmp_path / "state", hardware_root=tmp_path / "hw", telemetry_interval_s=3600.0,
            trust=TrustSettings([public_pem(package_key, tmp_path / "package.pem")],
                                [public_pem(controller_key, tmp_path / "controller.pem")]),
            inference=InferenceSettings(port=0),
            deploy=DeploySettings(request_interval_s=0.5, selection_budget_s=0.2, health_runs=2),
            models=ModelsSettings(memory_budget_mb=budget_mb, remove_drain_s=5.0))
        broker = MemoryBroker()
        observer = broker.transport("observer")
        observer.subscribe(f"{topics.ROOT}/devices/{DEVICE}/#")
        observer.connect()
        controller = broker.transport("controller")
        controller.connect()
        requests: queue.Queue[Message] = queue.Queue()
        artifacts = broker.transport("artifacts", requests)
        artifacts.connect()
        server = ArtifactServer(artifacts, gather_s=0.05).start()
        pump = InboxPump(requests, lambda m: _answer(server, m))
        agent = Agent(config, transport=broker.factory(f"edge-agent-{DEVICE}"))
        thread = threading.Thread(target=agent.run, daemon=True)
        thread.start()
        started.append((agent, thread))
        servers.append((server, pump))
        work = tmp_path / "work"
        work.mkdir()
        dev = SetDevice(agent, broker, controller, controller_key, package_key, work, server)
        first = observer.inbox.get(timeout=WAIT_S)
        while first.topic != topics.device(DEVICE, "presence"):
            first = observer.inbox.get(timeout=WAIT_S)
        assert Presence.from_payload(first.payload).online

        def collect() -> None:
            while not agent.stopping.is_set():
                try:
                    message = observer.inbox.get(timeout=0.2)
                except Exception:
                    continue
                if message.topic.endswith("/events"):
                    dev.events.append(DeviceEvent.from_payload(message.payload))

        threading.Thread(target=collect, daemon=True).start()
        return dev

    yield start
    for agent, thread in started:
        agent.stop()
        stopping.append(thread)
    for server, pump in servers:
        pump.close()
        server.stop()


def _answer(server: ArtifactServer, message: Message) -> None:
    report = read_report(message.topic, message.payload)
    if isinstance(report, ChunkRequest):
        server.handle_request(report)


def test_the_birth_says_the_agent_takes_sets_and_a_schema_it_does_not_speak_is_refused(
        device: Callable[..., SetDevice]) -> None:
    dev = device()
    birth = Birth.from_payload(dev.broker.retained(topics.device(DEVICE, "birth")) or b"")
    assert birth.desired_schemas == (1, 2) and birth.speaks(2)
    dev.send(sign(DESIRED_TYPE, json.dumps({"schema": 3, "type": "desired"}).encode(), dev.controller_key).to_bytes())
    refused = dev.wait(lambda e: e.status == "rejected", "the schema 3 refusal")
    assert "unsupported schema version 3 (this agent speaks 1, 2)" in refused.detail


def test_one_model_changes_and_one_goes_while_the_other_is_not_touched(device: Callable[..., SetDevice]) -> None:
    dev = device()
    a1, b1, a2 = dev.package("a", 1, seed=1), dev.package("b", 1, seed=2), dev.package("a", 2, seed=3)
    dev.desired_set([(a1, "d-a1"), (b1, "d-b1")])
    assert dev.done("d-a1", "a").status == "ok" and dev.done("d-b1", "b").status == "ok"
    assert dev.served() == {"a": "1", "b": "1"}
    b_runner = dev.agent.registry.get("b").runner
    dev.desired_set([(a2, "d-a2"), (b1, "d-b1")], "d-set-2")
    assert dev.done("d-a2", "a").status == "ok"
    assert dev.served() == {"a": "2", "b": "1"} and dev.agent.registry.get("b").runner is b_runner  # b never swapped
    assert not [e for e in dev.events if e.model == "b" and e.deployment_id != "d-b1"]  # nor redeployed
    state = dev.state()
    assert [(m.name, m.version, m.deployment_id) for m in state.models] == [("a", 2, "d-a2"), ("b", 1, "d-b1")]
    assert all(m.footprint_mb is not None and m.footprint_mb > 0 for m in state.models)  # measured, reported
    assert state.memory_budget_mb is not None and state.memory_budget_mb > 0  # physical memory or the cgroup's limit

    dev.desired_set([(a2, "d-a2")], "d-set-3")  # b is no longer named: removed
    removed = dev.wait(lambda e: e.state == "remove" and e.model == "b", "b removed")
    assert removed.deployment_id == "d-set-3" and removed.status == "ok" and "b v1 removed" in removed.detail
    assert dev.served() == {"a": "2"} and b_runner.is_active is False
    assert not (dev.agent.state_dir / "models" / "b").exists()  # its files are gone


def test_schema_1_is_the_set_of_its_one_model(device: Callable[..., SetDevice]) -> None:
    dev = device()
    a1, b1 = dev.package("a", 1, seed=1), dev.package("b", 1, seed=2)
    dev.desired_set([(a1, "d-a1"), (b1, "d-b1")])
    dev.done("d-b1", "b")
    dev.seq += 1
    now = time.time()
    old = DesiredState(DEVICE, dev.seq, now, now + 600, "d-old", DesiredModel("a", 1, a1.envelope))
    dev.send(sign(DESIRED_TYPE, old.to_payload(), dev.controller_key).to_bytes())
    dev.wait(lambda e: e.state == "remove" and e.model == "b", "b removed by a schema 1 desired state")
    answered = dev.wait(lambda e: e.deployment_id == "d-old", "a answered under the schema 1 id")
    assert "already active" in answered.detail and dev.served() == {"a": "1"}


def _admission_of(deployment: str, event: DeviceEvent) -> bool:
    return event.deployment_id == deployment and event.state == "admission"


def test_a_set_that_does_not_fit_is_refused_before_anything_is_touched(device: Callable[..., SetDevice]) -> None:
    dev = device(budget_mb=0.01)  # below even the model files' size (22 KB each)
    a1, b1 = dev.package("a", 1), dev.package("b", 1, seed=2)
    dev.desired_set([(a1, "d-a1"), (b1, "d-b1")], "d-big")
    whole = dev.wait(lambda e: e.state == "admission" and e.model is None, "the set's admission refusal")
    assert whole.deployment_id == "d-big" and whole.status == "failed"
    assert "and the budget is 0 MB" in whole.detail and "not measured yet" in whole.detail
    assert whole.data["budget_mb"] == 0.01 and whole.data["needed_mb"] > 0.01 and set(whole.data["models"]) == {"a", "b"}
    for model, deployment in (("a", "d-a1"), ("b", "d-b1")):  # each rollout learns it too
        refused = dev.wait(partial(_admission_of, deployment), model)
        assert refused.model == model
    assert dev.served() == {} and not list((dev.agent.state_dir / "downloads").glob("*"))  # nothing fetched
    assert not (dev.agent.state_dir / "models.json").exists()  # nor pointed at


def test_a_set_that_fits_until_staging_measures_it_is_refused_before_activate(device: Callable[..., SetDevice]) -> None:
    """22 KB of model file passes the first check; the ~10 MiB measured at staging does not fit 5 MB."""
    dev = device(budget_mb=5.0)
    dev.desired_set([(dev.package("a", 1), "d-a1")])
    done = dev.done("d-a1", "a")
    assert done.status == "failed" and done.detail.startswith("admission: the set needs")
    assert "measured at staging on onnxruntime/CPUExecutionProvider" in done.detail and "budget is 5 MB" in done.detail
    assert not [e for e in dev.events if e.state == "activate"] and dev.served() == {}


def test_a_rollback_command_names_one_model(device: Callable[..., SetDevice]) -> None:
    dev = device()
    a1, b1, a2, b2 = (dev.package(n, v, seed=s) for n, v, s in (("a", 1, 1), ("b", 1, 2), ("a", 2, 3), ("b", 2, 4)))
    dev.desired_set([(a1, "d-a1"), (b1, "d-b1")])
    dev.done("d-b1", "b")
    dev.desired_set([(a2, "d-a2"), (b2, "d-b2")], "d-set-2")
    dev.done("d-a2", "a")
    dev.done("d-b2", "b")
    dev.command("rollback", model="a")
    dev.wait(lambda e: e.state == "rollback" and e.model == "a" and e.status == "rolled-back", "a rolled back")
    assert dev.served() == {"a": "1", "b": "2"}
    dev.command("rollback", deployment_id="d-b2")  # by the deployment that installed it
    dev.wait(lambda e: e.state == "rollback" and e.model == "b" and e.status == "rolled-back", "b rolled back")
    assert dev.served() == {"a": "1", "b": "1"}
    dev.command("rollback", deployment_id="d-b2")  # sent again: b is no longer what d-b2 installed
    again = dev.wait(lambda e: e.state == "rollback" and e.status == "ok", "the repeated rollback")
    assert again.detail.startswith("nothing to roll back") and dev.served() == {"a": "1", "b": "1"}
