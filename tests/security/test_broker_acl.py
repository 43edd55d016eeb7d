"""A real Mosquitto running the config `edgectl broker config` generates: who may connect, read, write.

MQTT 3.1.1 denies silently, so every "cannot" is checked by a subscriber that must receive nothing,
next to a positive control showing that the same observer does receive what is allowed.
"""

from __future__ import annotations

import signal
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import MQTTProtocolVersion

from edgecore.protocol.chunks import PACKET_OVERHEAD
from edgecore.tls import tls_context
from edgectl.broker_config import MAX_PACKET_BYTES
from edgectl.pki import Algorithm, FleetPki, Usage
from edgectl.pki.authority import write_file
from tests.security.conftest import Fleet, Identity, Probe, connect, make_fleet

NOT_AUTHORIZED = 0x87
DEV = "edge/v1/devices"


@pytest.fixture
def probes() -> Iterator[list[Probe]]:
    """Probes to close at the end of the test."""
    opened: list[Probe] = []
    yield opened
    for probe in opened:
        probe.close()


def _login(fleet: Fleet, identity: Identity, client_id: str, probes: list[Probe],
           protocol: MQTTProtocolVersion = mqtt.MQTTv5) -> Probe:
    probe = connect(fleet.port, identity, client_id, protocol)
    probes.append(probe)
    assert probe.connected.is_set(), f"{client_id} could not log in: {probe.connack}"
    return probe


def _refused(fleet: Fleet, identity: Identity | None, client_id: str, probes: list[Probe]) -> bool:
    probe = connect(fleet.port, identity, client_id, timeout=3)
    probes.append(probe)
    return not probe.connected.is_set()


@pytest.mark.parametrize("protocol", [mqtt.MQTTv311, mqtt.MQTTv5], ids=["mqtt311", "mqtt5"])
def test_device_cannot_publish_to_another_device_or_controller_topics(fleet: Fleet, probes: list[Probe],
                                                                      protocol: MQTTProtocolVersion) -> None:
    controller = _login(fleet, fleet.controller, f"ctl-pub-{protocol}", probes)
    controller.subscribe(f"{DEV}/#")
    device_b = _login(fleet, fleet.device("dev-b"), f"b-pub-{protocol}", probes)
    device_b.subscribe(f"{DEV}/dev-b/desired")
    device_b.subscribe(f"{DEV}/dev-b/commands")
    device_b.subscribe("edge/v1/artifacts/+/chunks/+")
    device_a = _login(fleet, fleet.device("dev-a"), f"a-pub-{protocol}", probes, protocol)

    forbidden = [
        *(f"{DEV}/dev-b/{leaf}" for leaf in ("birth", "presence", "state", "events", "telemetry", "chunk-requests",
                                             "logs")),
        f"{DEV}/dev-b/desired", f"{DEV}/dev-b/commands", f"{DEV}/dev-a/desired", f"{DEV}/dev-a/commands",
        "edge/v1/artifacts/art-1/chunks/0",
    ]
    codes = [device_a.publish(topic, b"spoofed") for topic in forbidden]
    device_a.publish(f"{DEV}/dev-a/state", b"genuine")  # positive control

    assert controller.received() == [(f"{DEV}/dev-a/state", b"genuine")]
    assert device_b.received() == []
    if protocol == mqtt.MQTTv5:  # Mosquitto 2.0 answers a denied QoS 1 publish with 0x87
        assert all(code.value == NOT_AUTHORIZED for code in codes), codes


def test_device_reads_only_its_own_desired_commands_and_artifacts(fleet: Fleet, probes: list[Probe]) -> None:
    device_a = _login(fleet, fleet.device("dev-a"), "a-sub", probes)
    # Mosquitto 2.0.11 grants these SUBACKs; the ACL is enforced on every delivery instead.
    for topic in (f"{DEV}/dev-b/desired", f"{DEV}/dev-b/commands", f"{DEV}/+/desired", f"{DEV}/#", "#",
                  f"{DEV}/dev-a/desired", f"{DEV}/dev-a/commands", "edge/v1/artifacts/+/chunks/+"):
        device_a.subscribe(topic)
    device_b = _login(fleet, fleet.device("dev-b"), "b-sub", probes)
    controller = _login(fleet, fleet.controller, "ctl-sub", probes)

    for topic in (f"{DEV}/dev-b/desired", f"{DEV}/dev-b/commands", f"{DEV}/dev-a/desired", "edge/v1/artifacts/art-1/chunks/7"):
        assert not controller.publish(topic, b"x").is_failure, topic
    device_b.publish(f"{DEV}/dev-b/state", b"b-state")

    got = {topic for topic, _ in device_a.received()}
    assert got == {f"{DEV}/dev-a/desired", "edge/v1/artifacts/art-1/chunks/7"}


def test_controller_reads_all_devices_and_writes_commands(fleet: Fleet, probes: list[Probe]) -> None:
    controller = _login(fleet, fleet.controller, "ctl-rw", probes)
    controller.subscribe(f"{DEV}/+/events")
    device_b = _login(fleet, fleet.device("dev-b"), "b-rw", probes, mqtt.MQTTv311)
    device_b.subscribe(f"{DEV}/dev-b/commands")

    device_b.publish(f"{DEV}/dev-b/events", b"installed")
    assert controller.publish(f"{DEV}/dev-b/commands", b"rollback").value == 0

    assert controller.received() == [(f"{DEV}/dev-b/events", b"installed")]
    assert device_b.received() == [(f"{DEV}/dev-b/commands", b"rollback")]


def test_every_device_reads_the_fleet_beacon_and_only_the_controller_writes_it(fleet: Fleet, probes: list[Probe]) -> None:
    """The beacon (docs/protocol.md, Beacon) proves a broker is the fleet's: a device must not be able to forge it."""
    beacon = "edge/v1/fleet/beacon"
    readers = [_login(fleet, fleet.device(name), f"{name}-beacon", probes) for name in ("dev-a", "dev-b")]
    for reader in readers:
        reader.subscribe(beacon)
    controller = _login(fleet, fleet.controller, "ctl-beacon", probes)
    assert readers[1].publish(beacon, b"forged").value == NOT_AUTHORIZED
    assert not controller.publish(beacon, b"signed").is_failure
    for reader in readers:
        assert reader.received() == [(beacon, b"signed")]


def test_client_id_of_another_device_gives_no_access_to_its_topics(fleet: Fleet, probes: list[Probe]) -> None:
    # The ACL keys on the certificate's CN, not the client id a client chooses.
    impostor = _login(fleet, fleet.device("dev-a"), "dev-b", probes)
    impostor.subscribe(f"{DEV}/dev-b/desired")
    controller = _login(fleet, fleet.controller, "ctl-id", probes)
    controller.publish(f"{DEV}/dev-b/desired", b"for b only")
    assert impostor.received() == []


def test_clients_without_a_fleet_certificate_are_refused(fleet: Fleet, tmp_path: Path, probes: list[Probe]) -> None:
    ca = fleet.pki.ca_cert_path
    assert _refused(fleet, None, "anonymous-plaintext", probes)
    assert _refused(fleet, Identity(ca, None, None), "tls-without-cert", probes)
    assert _refused(fleet, fleet.device("dev-r"), "revoked", probes)

    stranger = FleetPki.init(tmp_path / "other-pki", Algorithm.P256).issue("dev-a", Usage.CLIENT, 30)
    server = fleet.pki.issue("dev-a", Usage.SERVER, 30)  # right CA, but a server-only certificate
    for name, identity in (("foreign-ca", stranger), ("server-cert", server)):
        write_file(tmp_path / f"{name}.pem", identity.cert_pem)
        write_file(tmp_path / f"{name}.key", identity.key_pem, 0o600)
        assert _refused(fleet, Identity(ca, tmp_path / f"{name}.pem", tmp_path / f"{name}.key"), name, probes), name


def _refused_soon(fleet: Fleet, identity: Identity, client_id: str, probes: list[Probe], timeout: float = 15.0) -> bool:
    """Whether logins get refused within ``timeout`` (Mosquitto handles SIGHUP in its main loop)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _refused(fleet, identity, client_id, probes):
            return True
        time.sleep(0.2)
    return False


def test_revocation_takes_effect_after_reload_and_restart(tmp_path: Path, probes: list[Probe]) -> None:
    fleet = make_fleet(tmp_path)
    device = fleet.enroll("dev-c")
    broker = fleet.start_broker()
    try:
        _login(fleet, device, "c-before", probes)
        fleet.pki.revoke("dev-c")  # rewrites the broker's crlfile (a registered CRL target)
        assert _login(fleet, device, "c-before-reload", probes)  # Mosquitto has not read it yet
        assert broker.process is not None
        broker.process.send_signal(signal.SIGHUP)  # reload: TLS files, CRL included
        assert _refused_soon(fleet, device, "c-after-reload", probes)
        broker.restart()
        assert _refused(fleet, device, "c-after-restart", probes)
    finally:
        broker.stop()


@pytest.mark.parametrize("tls_max", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3], ids=["tls12", "tls13"])
def test_ed25519_fleet_works_with_mosquitto(tmp_path: Path, probes: list[Probe], tls_max: ssl.TLSVersion) -> None:
    fleet = make_fleet(tmp_path, Algorithm.ED25519)
    device = fleet.enroll("dev-e")
    broker = fleet.start_broker()
    try:
        context = tls_context(device.ca, device.cert, device.key)
        context.maximum_version = tls_max
        probe = connect(fleet.port, device, "e", context=context)
        probes.append(probe)
        assert probe.connected.is_set(), probe.connack
        assert not probe.publish(f"{DEV}/dev-e/state").is_failure
        assert probe.publish(f"{DEV}/dev-x/state").value == NOT_AUTHORIZED
    finally:
        broker.stop()


def test_messages_over_the_generated_size_limit_are_neither_delivered_nor_retained(fleet: Fleet, probes: list[Probe]) -> None:
    """A device may not push 100 MB messages (or retain them) through the broker: the limit holds for MQTT 3.1.1 too,
    whose clients are not told it."""
    assert f"max_packet_size {MAX_PACKET_BYTES}\n" in fleet.conf.read_text()
    controller = _login(fleet, fleet.controller, "ctl-size", probes)
    controller.subscribe(f"{DEV}/+/telemetry")
    device = _login(fleet, fleet.device("dev-a"), "a-size", probes, mqtt.MQTTv311)
    fits = b"t" * (MAX_PACKET_BYTES - PACKET_OVERHEAD)
    device.publish(f"{DEV}/dev-a/telemetry", fits)  # positive control: a chunk or a desired state still fits
    assert [(t, len(p)) for t, p in controller.received()] == [(f"{DEV}/dev-a/telemetry", len(fits))]

    device.client.publish(f"{DEV}/dev-a/telemetry", b"x" * (MAX_PACKET_BYTES + 1), qos=1, retain=True)
    assert controller.received(timeout=2.0) == []
    deadline = time.monotonic() + 5
    while device.client.is_connected() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not device.client.is_connected()  # Mosquitto cut the sender off
    late = _login(fleet, fleet.controller, "ctl-size-late", probes)
    late.subscribe(f"{DEV}/dev-a/telemetry")
    assert late.received() == [], "an oversized message was retained"
