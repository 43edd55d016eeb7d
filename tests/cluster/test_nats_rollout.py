"""A rollout on a 3-node NATS cluster survives the death of the node the agent, or the controller, is connected to.

Real parts throughout: three nats-server processes (JetStream, MQTT), `edgectl controller run`,
an `edge-agent run` process given the three URLs (``brokers:``), edgectl as a user runs it.
"""

from __future__ import annotations

import json
import queue
import signal
import time
import uuid
from pathlib import Path

import pytest

from edgecore.errors import BrokerUnavailable
from edgecore.protocol import topics
from edgecore.protocol.envelope import Envelope
from edgecore.protocol.manifest import TargetInfo
from edgecore.transport import Message, MqttTransport, start_index
from edgectl.controller import FINAL, RolloutStatus, SqliteStore
from edgectl.examples import tiny_classifier
from edgectl.keys import Keyring
from edgectl.package import BuildOptions, build_package
from tests.control.conftest import ControllerProcess
from tests.fleet import AgentProcess, EdgectlHome, wait_for
from tests.nats_cluster import NatsCluster, NatsNode

DEVICE = "cam-1"


def retained(urls: list[str], topic: str, timeout: float = 45.0) -> bytes | None:
    """The retained message on ``topic`` as a fresh client of ``urls`` sees it (None: there is none)."""
    inbox: queue.Queue[Message] = queue.Queue()
    probe = MqttTransport(urls, f"probe-{uuid.uuid4().hex[:6]}", inbox=inbox)

    def connected() -> bool:
        try:
            probe.connect(timeout=3)  # a node refuses sessions while JetStream elects new leaders
        except BrokerUnavailable:
            return False
        return True

    deadline = time.monotonic() + timeout
    wait_for(connected, timeout, "an MQTT session on a surviving node")
    try:
        probe.subscribe(topic)  # refused subscriptions are retried by the transport
        try:
            return inbox.get(timeout=max(5.0, deadline - time.monotonic())).payload
        except queue.Empty:
            return None
    finally:
        probe.close()


def package(home: EdgectlHome, version: int) -> Path:
    onnx = tiny_classifier(home.path / f"clf-{version}.onnx", seed=version)
    out = home.path / f"clf-{version}.edgepkg"
    build_package(onnx, BuildOptions("clf", version, TargetInfo("any")), Keyring(home.path / "keys").signing_key("package"), out)
    return out


def node_of(cluster: NatsCluster, client_prefix: str) -> NatsNode | None:
    return cluster.node_of(client_prefix)


def starting_on(client_id: str, nodes: list[NatsNode]) -> list[str]:
    """The nodes' URLs placed so that ``client_id`` tries them in the order of ``nodes``, the first one first."""
    urls = [""] * len(nodes)
    for i, node in enumerate(nodes):
        urls[(start_index(client_id, len(nodes)) + i) % len(nodes)] = node.url
    return urls


def controller_node(cluster: NatsCluster) -> NatsNode | None:
    """The one node the controller is on; None while it is on none, or also on another one (reconciliation opens a
    second, short-lived connection of its own, wherever its client id hashes to)."""
    nodes = [n for n in cluster.nodes if n.alive() and any(c.startswith("edgectl-controller") for c in n.mqtt_clients())]
    return nodes[0] if len(nodes) == 1 else None


@pytest.mark.parametrize("victim", ["agent", "controller"])
def test_rollout_completes_after_the_node_of_the_agent_or_controller_is_killed(
        tmp_path: Path, nats: NatsCluster, victim: str) -> None:
    n1, n2, n3 = nats.nodes
    # Each client starts where its id hashes to in its list (edgecore.transport.start_index): the agent's list is
    # placed so that it starts on n1; the controller (a client id new at every start) lists n2 and n3 only, so
    # each is on a node of its own.
    home = EdgectlHome(tmp_path / "home", f"{n2.url},{n3.url}")
    home.path.mkdir()
    home.edgectl("keys", "init", check=True)
    controller = ControllerProcess(home, tmp_path / "controller.log").start()
    agent = AgentProcess(DEVICE, tmp_path / DEVICE, "mqtt://127.0.0.1:1", [home.public_key("package")],
                         [home.public_key("controller")], extra={"brokers": starting_on(f"edge-agent-{DEVICE}", nats.nodes)})
    try:
        agent.start()
        wait_for(lambda: node_of(nats, f"edge-agent-{DEVICE}") is n1, 30, "the agent on n1")
        on = wait_for(lambda: controller_node(nats), 30, "the controller on n2 or n3")
        assert on in (n2, n3)
        pkg = package(home, 1)
        assert agent.process is not None
        if victim == "agent":
            # Frozen, it cannot see the desired state before its node dies: it must find it retained on another node.
            agent.process.send_signal(signal.SIGSTOP)
        result = home.edgectl("deploy", str(pkg), "--fleet", "all", "--waves", "100%", "--bake", "1s", "--json", check=True)
        rollout_id = str(json.loads(result.stdout)["rollout_id"])
        desired = topics.device(DEVICE, "desired")
        # The rollout's desired state, not the acknowledgement the controller retains for a device that connects.
        before = wait_for(lambda: (raw := retained([n3.url], desired, 5)) and rollout_id in _deployments(raw) and raw,
                          30, "the rollout's desired state retained in the cluster")

        killed = n1 if victim == "agent" else on
        killed.kill()
        if victim == "agent":
            agent.process.send_signal(signal.SIGCONT)
        survivors = [node.url for node in nats.nodes if node is not killed]
        # The retained desired state outlived its node: the same deployment (the controller, reconnected to a
        # surviving node, may already have republished it signed afresh, so the bytes may differ).
        assert _deployments(retained(survivors, desired)) == _deployments(before)

        store = SqliteStore(home.path / "controller.db")
        wait_for(lambda: (row := store.rollout(rollout_id)) is not None and row.status in FINAL, 90, "the rollout to end")
        row = store.rollout(rollout_id)
        assert row is not None and row.status == RolloutStatus.DONE, row
        active = agent.active()
        assert active is not None and active["version"] == 1
        wait_for(lambda: agent.model_ready("clf"), 30, "the model served")
        client = f"edge-agent-{DEVICE}" if victim == "agent" else "edgectl-controller"
        moved = wait_for(lambda: node_of(nats, client), 30, f"{client} connected")  # between reconnects it is on none
        assert moved is not killed
    finally:
        if agent.process is not None:
            agent.process.send_signal(signal.SIGCONT)
        agent.stop()
        controller.stop()


def _deployments(raw: bytes | None) -> str:
    """The deployment ids a retained desired state names (schema 1's model or schema 2's set)."""
    assert raw is not None, "no retained desired state"
    body = json.loads(Envelope.from_bytes(raw).payload)
    if "models" in body:  # schema 2: each model of the set under the deployment that put it there
        return ",".join(sorted(f"{m['name']}:{m['deployment_id']}" for m in body["models"]))
    return str(body["deployment_id"])
