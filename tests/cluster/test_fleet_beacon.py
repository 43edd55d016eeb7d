"""Brokers that are not the fleet's (issue 27 item 5): real Mosquitto brokers, agent processes, the controller service.

A standalone broker (holding a beacon signed by another key) listed first in an agent's brokers
used to hold the device for good. Now the agent waits ``broker_check_s`` for the controller's
signed beacon or a desired state signed for itself and moves on to the next URL; an agent on the
fleet's broker, where the real controller keeps its beacon, stays.
"""

from __future__ import annotations

import queue
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgecore.protocol import topics
from edgecore.protocol.beacon import signed_beacon, verify_beacon
from edgecore.protocol.envelope import TrustedKeys, public_key_pem
from edgecore.transport import Message, MqttTransport
from edgectl.controller import SqliteStore
from edgectl.controller.service import Controller
from tests.brokers import BrokerProcess, mosquitto_binary, start_mosquitto
from tests.cluster.test_transport_failover import listed
from tests.fleet import AgentProcess, wait_for

CHECK_S = 2.0


@pytest.fixture
def brokers(tmp_path: Path) -> Iterator[tuple[BrokerProcess, BrokerProcess]]:
    """The fleet's broker and a standalone one (reachable, not the cluster's)."""
    if mosquitto_binary() is None:
        pytest.fail("mosquitto is not installed: ./scripts/test installs it (apt-get install mosquitto)")
    fleet, standalone = start_mosquitto(tmp_path / "fleet"), start_mosquitto(tmp_path / "standalone")
    yield fleet, standalone
    fleet.stop()
    standalone.stop()


def retained(broker: BrokerProcess, topic: str) -> bytes | None:
    """The message ``broker`` keeps retained on ``topic`` (None: none within a second)."""
    inbox: queue.Queue[Message] = queue.Queue()
    reader = MqttTransport(broker.url, f"reader-{uuid.uuid4().hex[:6]}", inbox=inbox)
    reader.subscribe(topic, 1)
    reader.connect()
    try:
        return inbox.get(timeout=1.0).payload
    except queue.Empty:
        return None
    finally:
        reader.close()


def test_an_agent_leaves_a_standalone_broker_for_the_fleets_and_one_on_the_fleets_stays(
        tmp_path: Path, brokers: tuple[BrokerProcess, BrokerProcess], monkeypatch: pytest.MonkeyPatch) -> None:
    fleet, standalone = brokers
    monkeypatch.setenv("EDGECTL_HOME", str(tmp_path / "home"))  # where the controller's sequence numbers live
    (tmp_path / "home").mkdir()
    key, package_key, stranger = (Ed25519PrivateKey.generate() for _ in range(3))
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "controller.pub").write_text(public_key_pem(key.public_key()))
    (keys / "package.pub").write_text(public_key_pem(package_key.public_key()))
    # A beacon signed by a key the devices do not trust proves nothing: it must not keep the agent there.
    sender = MqttTransport(standalone.url, "forger", inbox=queue.Queue())
    sender.connect()
    assert sender.publish(topics.FLEET_BEACON, signed_beacon(stranger), retain=True, wait=5)
    sender.close()
    assert retained(standalone, topics.FLEET_BEACON) is not None

    def connection(inbox: queue.Queue[Message], hook: object) -> MqttTransport:
        return MqttTransport(fleet.url, f"ctl-{uuid.uuid4().hex[:6]}", inbox=inbox, on_connect=hook)  # type: ignore[arg-type]

    controller = Controller(SqliteStore(tmp_path / "controller.db"), connection, key,
                            TrustedKeys([package_key.public_key()]), tick_s=0.2)
    thread = threading.Thread(target=controller.run, daemon=True)
    thread.start()
    agents: list[AgentProcess] = []
    try:
        # The leading controller keeps its signed beacon retained on the fleet's broker.
        beacon = wait_for(lambda: retained(fleet, topics.FLEET_BEACON), 20, "the controller's beacon")
        verify_beacon(beacon, TrustedKeys([key.public_key()]))

        def agent(device_id: str, *order: BrokerProcess) -> AgentProcess:
            return AgentProcess(device_id, tmp_path / device_id, ",".join(listed(f"edge-agent-{device_id}", *order)),
                                [keys / "package.pub"], [keys / "controller.pub"], extra={"broker_check_s": CHECK_S})

        lost, home = agent("dev-lost", standalone, fleet), agent("dev-home", fleet, standalone)
        agents += [lost, home]
        for one in agents:  # both at once (AgentProcess.start waits for each): an agent's start is most of the time
            config = one.write_config()
            with one.log.open("ab") as out:
                one.process = subprocess.Popen([one.python, "-m", "agent.cli.main", "run", "--config", str(config)],
                                               stdout=out, stderr=subprocess.STDOUT, env=one.env())

        def in_store(device_id: str) -> bool:
            device = controller.store.device(device_id)
            return device is not None and device.birth is not None

        wait_for(lambda: in_store("dev-lost"), 30 + CHECK_S, "dev-lost's birth to reach the controller")
        left = f"leaving broker 127.0.0.1:{standalone.port}: not the fleet's broker"
        assert left in lost.log_text(), lost.log_text()[-3000:]
        assert "no proof that 127.0.0.1:" in lost.log_text() and "untrusted key" in lost.log_text()  # the forged beacon
        moved = wait_for(lambda: [e for e in controller.store.events("dev-lost") if e.state == "broker"], 10,
                         "dev-lost's broker/moved event at the controller")
        assert moved[0].status == "moved" and f"127.0.0.1:{standalone.port}" in moved[0].detail

        wait_for(lambda: in_store("dev-home"), 30, "dev-home's birth to reach the controller")
        wait_for(lambda: f"broker 127.0.0.1:{fleet.port} is the fleet's" in home.log_text(), 10,
                 "dev-home to find the fleet's proof")
        assert "leaving broker" not in home.log_text()
        assert "is the fleet's" in lost.log_text()  # proven on the fleet's broker after the move: it stays there
    finally:
        for one in agents:
            one.stop()
        controller.stop()
        thread.join(10)
