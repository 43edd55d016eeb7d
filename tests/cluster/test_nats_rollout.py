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

from agent.errors import BrokerUnavailable
from agent.protocol import topics
from agent.protocol.manifest import TargetInfo
from agent.transport import Message, MqttTransport
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


@pytest.mark.parametrize("victim", ["agent", "controller"])
def test_rollout_completes_after_the_node_of_the_agent_or_controller_is_killed(
        tmp_path: Path, nats: NatsCluster, victim: str) -> None:
    n1, n2, n3 = nats.nodes
    # The agent lists n1 first and the controller n2 first: each starts on a node of its own.
    home = EdgectlHome(tmp_path / "home", f"{n2.url},{n3.url},{n1.url}")
    home.path.mkdir()
    home.edgectl("keys", "init", check=True)
    controller = ControllerProcess(home, tmp_path / "controller.log").start()
    agent = AgentProcess(DEVICE, tmp_path / DEVICE, "mqtt://127.0.0.1:1", [home.public_key("package")],
                         [home.public_key("controller")], extra={"brokers": nats.urls})
    try:
        agent.start()
        wait_for(lambda: node_of(nats, f"edge-agent-{DEVICE}") is n1, 30, "the agent on n1")
        wait_for(lambda: node_of(nats, "edgectl-controller") is n2, 30, "the controller on n2")
        pkg = package(home, 1)
        assert agent.process is not None
        if victim == "agent":
            # Frozen, it cannot see the desired state before its node dies: it must find it retained on another node.
            agent.process.send_signal(signal.SIGSTOP)
        result = home.edgectl("deploy", str(pkg), "--fleet", "all", "--waves", "100%", "--bake", "1s", "--json", check=True)
        rollout_id = str(json.loads(result.stdout)["rollout_id"])
        desired = topics.device(DEVICE, "desired")
        before = wait_for(lambda: retained([n3.url], desired, 5), 30, "the desired state retained in the cluster")

        killed = n1 if victim == "agent" else n2
        killed.kill()
        if victim == "agent":
            agent.process.send_signal(signal.SIGCONT)
        survivors = [node.url for node in nats.nodes if node is not killed]
        assert retained(survivors, desired) == before  # the retained desired state outlived its node

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
