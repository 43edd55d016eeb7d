"""Which broker is the fleet's (agent/fleet_check.py) on the in-memory broker: what proves it, what does not, when.

The end-to-end case (an agent process leaving a standalone Mosquitto for the fleet's, the real
controller's beacon) is tests/cluster/test_fleet_beacon.py; here each proof and each refusal,
with the check's clock in the test's hands.
"""

from __future__ import annotations

import logging
import math
import queue
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agent.config import AgentConfig, TrustSettings
from agent.fleet_check import FleetCheck
from edgecore.errors import ConfigError, VerificationError
from edgecore.protocol import topics
from edgecore.protocol.beacon import BEACON_TYPE, BEACON_VALIDITY_S, Beacon, signed_beacon, verify_beacon
from edgecore.protocol.envelope import DESIRED_TYPE, TrustedKeys, public_key_pem, sign
from edgecore.protocol.messages import DesiredState
from edgecore.transport import Message
from edgecore.transport_memory import MemoryBroker

CHECK_S = 120.0
KEY = Ed25519PrivateKey.generate()
STRANGER = Ed25519PrivateKey.generate()
ALONE = "it is the only broker configured"


def desired_for(device_id: str, key: Ed25519PrivateKey = KEY) -> bytes:
    """The controller's acknowledgement (an empty desired state) for ``device_id``, signed by ``key``."""
    now = time.time()
    return sign(DESIRED_TYPE, DesiredState(device_id, 1, now, now + 60, "ack", None).to_payload(), key).to_bytes()


class Device:
    """A device's connection and its check, on ``broker``; the check's clock is ``now``."""

    def __init__(self, broker: MemoryBroker, check_s: float = CHECK_S, device_id: str = "dev-1") -> None:
        self.now = 0.0
        self.inbox: queue.Queue[Message] = queue.Queue()
        self.moved: list[str] = []
        self.transport = broker.transport(f"edge-agent-{device_id}", self.inbox, lambda: self.check.connected())
        self.check = FleetCheck(device_id, self.transport, lambda: TrustedKeys([KEY.public_key()]), check_s,
                                lambda reason, _waited: self.moved.append(reason), clock=lambda: self.now)
        for topic in (topics.device(device_id, "desired"), *self.check.topics):
            self.transport.subscribe(topic, 1)
        self.transport.connect()
        self.drain()

    def drain(self) -> None:
        while not self.inbox.empty():
            self.check.saw(self.inbox.get())

    def after(self, seconds: float) -> None:
        """``seconds`` pass, then the agent's main loop ticks the check."""
        self.now += seconds
        self.drain()
        self.check.tick()


def retain(broker: MemoryBroker, topic: str, payload: bytes) -> None:
    sender = broker.transport("controller")
    sender.connect()
    assert sender.publish(topic, payload, retain=True)
    sender.close()


def test_the_controllers_beacon_proves_the_broker(caplog: pytest.LogCaptureFixture) -> None:
    broker = MemoryBroker()
    retain(broker, topics.FLEET_BEACON, signed_beacon(KEY))
    device = Device(broker)
    assert device.check.proven
    with caplog.at_level(logging.WARNING, logger="agent.fleet_check"):
        device.after(10 * CHECK_S)
    assert device.moved == [] and ALONE not in caplog.text


@pytest.mark.parametrize("payload", [
    signed_beacon(STRANGER),  # another key: forged
    signed_beacon(KEY, now=time.time() - BEACON_VALIDITY_S - 1),  # expired
    sign(DESIRED_TYPE, Beacon(time.time(), time.time() + 60).to_payload(), KEY).to_bytes(),  # another payload type
    sign(BEACON_TYPE, b'{"schema": 1, "type": "desired", "ts": 1, "expires": 1e12}', KEY).to_bytes(),  # another type inside
    b"not an envelope",
], ids=["forged", "expired", "wrong-payload-type", "wrong-type", "malformed"])
def test_a_beacon_that_is_not_the_controllers_proves_nothing(payload: bytes, caplog: pytest.LogCaptureFixture) -> None:
    broker = MemoryBroker()
    retain(broker, topics.FLEET_BEACON, payload)
    device = Device(broker)
    assert not device.check.proven
    with caplog.at_level(logging.WARNING, logger="agent.fleet_check"):
        device.after(CHECK_S)
    assert ALONE in caplog.text and "within 120s (broker_check_s)" in caplog.text


def test_a_desired_state_signed_for_this_device_proves_the_broker() -> None:
    broker = MemoryBroker()
    retain(broker, topics.device("dev-1", "desired"), desired_for("dev-1"))
    assert Device(broker).check.proven


@pytest.mark.parametrize("payload", [desired_for("dev-2"), desired_for("dev-1", STRANGER)], ids=["another-device", "forged"])
def test_a_desired_state_not_signed_for_this_device_proves_nothing(payload: bytes) -> None:
    broker = MemoryBroker()
    retain(broker, topics.device("dev-1", "desired"), payload)
    assert not Device(broker).check.proven


def test_one_url_warns_once_and_stays(caplog: pytest.LogCaptureFixture) -> None:
    broker = MemoryBroker()
    device = Device(broker)
    with caplog.at_level(logging.WARNING, logger="agent.fleet_check"):
        device.after(CHECK_S - 1)
        assert ALONE not in caplog.text  # not before broker_check_s
        device.after(1)
        broker.drop(device.transport.client_id)
        broker.start()  # a reconnect: checked again, not said again
        device.after(CHECK_S)
    assert caplog.text.count(ALONE) == 1 and device.transport.connected and device.moved == []


def test_every_connect_must_prove_itself_again() -> None:
    broker = MemoryBroker()
    retain(broker, topics.FLEET_BEACON, signed_beacon(KEY))
    device = Device(broker)
    assert device.check.proven
    retain(broker, topics.FLEET_BEACON, b"")  # cleared: the node it reconnects to keeps no beacon
    broker.drop(device.transport.client_id)
    broker.start()
    device.drain()
    assert not device.check.proven
    retain(broker, topics.FLEET_BEACON, signed_beacon(KEY))  # the controller's next beacon, live
    device.drain()
    assert device.check.proven


def test_zero_turns_the_check_off(caplog: pytest.LogCaptureFixture) -> None:
    device = Device(MemoryBroker(), check_s=0)
    assert device.check.topics == ()
    with caplog.at_level(logging.WARNING, logger="agent.fleet_check"):
        device.after(10 * CHECK_S)
    assert ALONE not in caplog.text


def test_the_beacon_is_valid_for_a_desired_states_window() -> None:
    """The skew a desired state tolerates (7 days) is the beacon's too: a device clock that far ahead still accepts it."""
    trusted = TrustedKeys([KEY.public_key()])
    beacon = verify_beacon(signed_beacon(KEY, now=1000.0), trusted, now=1000.0 + BEACON_VALIDITY_S)
    assert beacon.expires == 1000.0 + 7 * 86400
    with pytest.raises(VerificationError, match="beacon expired"):
        verify_beacon(signed_beacon(KEY, now=1000.0), trusted, now=1001.0 + BEACON_VALIDITY_S)


@pytest.mark.parametrize("value", [-1.0, math.nan])
def test_broker_check_s_must_be_zero_or_seconds(value: float, tmp_path: Path) -> None:
    key = tmp_path / "package.pub"
    key.write_text(public_key_pem(KEY.public_key()))
    trust = TrustSettings(packages=[key])
    assert AgentConfig("dev-1", trust=trust, broker_check_s=0).check("agent.yaml").broker_check_s == 0
    with pytest.raises(ConfigError, match=r"agent.yaml: broker_check_s must be 0 \(off\) or a number of seconds"):
        AgentConfig("dev-1", trust=trust, broker_check_s=value).check("agent.yaml")
