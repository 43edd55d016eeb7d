"""Fixtures for the security tests: a fleet PKI, a Mosquitto running its generated config, MQTT probes."""

from __future__ import annotations

import os
import queue
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from edgecore.tls import tls_context
from edgectl.broker_config import write_broker_config
from edgectl.pki import Algorithm, FleetPki, enroll_device
from tests.brokers import BrokerProcess, free_port, mosquitto_binary, start_mosquitto

QUIET = 0.7  # seconds to wait for a message that must NOT arrive (no timing is asserted)


@dataclass(frozen=True)
class Identity:
    """Files a client logs in with."""

    ca: Path
    cert: Path | None
    key: Path | None


@dataclass
class Fleet:
    """A PKI with enrolled devices and the broker config generated for it."""

    pki: FleetPki
    root: Path
    port: int
    conf: Path
    broker: BrokerProcess | None = None

    def device(self, device_id: str) -> Identity:
        bundle = self.root / "bundles" / device_id
        return Identity(bundle / "ca.pem", bundle / "device.pem", bundle / "device.key")

    @property
    def controller(self) -> Identity:
        return Identity(self.pki.ca_cert_path, self.pki.controller_cert_path, self.pki.controller_key_path)

    def enroll(self, device_id: str) -> Identity:
        enroll_device(self.pki, device_id, self.root / "bundles" / device_id, "mqtts://localhost:8883", {}, 30)
        return self.device(device_id)

    def start_broker(self) -> BrokerProcess:
        # As root Mosquitto drops to the mosquitto user, which cannot enter pytest's 0700 tmp dirs.
        stay = "user root\n" if os.geteuid() == 0 else ""
        self.broker = start_mosquitto(self.root / "run", extra_config=self.conf.read_text() + stay, port=self.port)
        return self.broker


def make_fleet(root: Path, algorithm: Algorithm = Algorithm.P256) -> Fleet:
    """Init a PKI in ``root`` and generate the broker config for it on a free port."""
    if mosquitto_binary() is None:
        pytest.skip("mosquitto is not installed (apt-get install mosquitto)")
    pki = FleetPki.init(root / "pki", algorithm)
    port = free_port()
    config = write_broker_config(pki, root / "broker", port, ["localhost", "127.0.0.1"])
    return Fleet(pki=pki, root=root, port=port, conf=config.conf)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Devices dev-a, dev-b and a revoked dev-r, with Mosquitto running the generated config."""
    fleet = make_fleet(tmp_path_factory.mktemp("fleet"))
    for device_id in ("dev-a", "dev-b", "dev-r"):
        fleet.enroll(device_id)
    fleet.pki.revoke("dev-r")
    fleet.start_broker()
    yield fleet
    assert fleet.broker is not None
    fleet.broker.stop()


@dataclass
class Probe:
    """A paho 2.x client that records what the broker tells it."""

    client: mqtt.Client
    connected: threading.Event = field(default_factory=threading.Event)
    answered: threading.Event = field(default_factory=threading.Event)  # CONNACK or connection lost
    connack: Any = None
    messages: queue.Queue[mqtt.MQTTMessage] = field(default_factory=queue.Queue)
    acks: queue.Queue[Any] = field(default_factory=queue.Queue)

    def subscribe(self, topic: str) -> list[Any]:
        """Subscribe at QoS 1 and return the broker's SUBACK reason codes."""
        self.client.subscribe(topic, qos=1)
        return list(self.acks.get(timeout=5))

    def publish(self, topic: str, payload: bytes = b"{}") -> Any:
        """Publish at QoS 1 and return the PUBACK reason code (always success under MQTT 3.1.1)."""
        info = self.client.publish(topic, payload, qos=1)
        info.wait_for_publish(timeout=5)
        return self.acks.get(timeout=5)

    def received(self, timeout: float = QUIET) -> list[tuple[str, bytes]]:
        """Messages that arrive within ``timeout``."""
        got = []
        try:
            while True:
                msg = self.messages.get(timeout=timeout)
                got.append((msg.topic, bytes(msg.payload)))
        except queue.Empty:
            return got

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def connect(
    port: int,
    identity: Identity | None,
    client_id: str,
    protocol: MQTTProtocolVersion = mqtt.MQTTv5,
    context: ssl.SSLContext | None = None,
    timeout: float = 5.0,
) -> Probe:
    """Connect a probe; ``identity`` None means plaintext MQTT. Check ``probe.connected`` after."""
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=protocol)
    probe = Probe(client)
    if identity is not None:
        client.tls_set_context(context or tls_context(identity.ca, identity.cert, identity.key))

    def on_connect(_c: Any, _u: Any, _f: Any, reason: Any, _p: Any) -> None:
        probe.connack = reason
        if not reason.is_failure:
            probe.connected.set()
        probe.answered.set()

    client.on_connect = on_connect
    client.on_disconnect = lambda *_args: probe.answered.set()
    client.on_message = lambda _c, _u, msg: probe.messages.put(msg)
    client.on_subscribe = lambda _c, _u, _m, codes, _p: probe.acks.put(codes)
    client.on_publish = lambda _c, _u, _m, code, _p: probe.acks.put(code)
    try:
        client.connect("localhost", port, keepalive=30)
    except (OSError, ssl.SSLError):
        return probe  # refused during the TLS handshake
    client.loop_start()
    probe.answered.wait(timeout)
    return probe
