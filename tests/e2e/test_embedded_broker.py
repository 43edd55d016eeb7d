"""The embedded broker (`edgectl broker`, amqtt): retained messages reach only the topics subscribed, and an MQTT 5
client is refused at once (CONNACK 0x01), so it falls back to 3.1.1 without waiting for a timeout.

amqtt 0.12 handed every new connection the retained messages of every filter any client held (each simulated
device of the demo started with other devices' desired states, reported as rejected), and read an MQTT 5
CONNECT with a will wrongly, waiting for bytes that never came (10 s per client before its fallback).
"""

from __future__ import annotations

import queue
import socket
import time

from edgecore.transport import Message, MqttTransport
from tests.brokers import BrokerProcess


def _mqtt5_connect_with_will(client_id: bytes) -> bytes:
    will_properties = b"\x05\x18\x00\x00\x00\x00"  # length 5: will delay interval 0
    variable = b"\x00\x04MQTT\x05" + bytes([0x02 | 0x04 | 0x08 | 0x20]) + b"\x00\x0a" + b"\x00"  # clean start, will qos 1 retain
    payload = (len(client_id).to_bytes(2, "big") + client_id + will_properties
               + b"\x00\x05a/b/c" + b"\x00\x02{}")
    body = variable + payload
    return bytes([0x10, len(body)]) + body


def test_an_mqtt5_connect_with_a_will_is_answered_unsupported_version(embedded_broker: BrokerProcess) -> None:
    with socket.create_connection(("127.0.0.1", embedded_broker.port), timeout=5) as sock:
        sock.sendall(_mqtt5_connect_with_will(b"five"))
        answer = sock.recv(4)  # before the fix: no answer (socket.timeout after 5 s)
    assert answer == b"\x20\x02\x00\x01"  # CONNACK, return code 1: unacceptable protocol version


def _client(url: str, client_id: str, topic: str) -> tuple[MqttTransport, queue.Queue[Message]]:
    inbox: queue.Queue[Message] = queue.Queue()
    transport = MqttTransport(url, client_id, inbox=inbox, protocol="3.1.1")
    transport.subscribe(topic, 1)
    transport.connect()
    return transport, inbox


def test_a_retained_message_reaches_only_clients_subscribed_to_its_topic(embedded_broker: BrokerProcess) -> None:
    device_a, inbox_a = _client(embedded_broker.url, "dev-a", "edge/v1/devices/a/desired")
    publisher = MqttTransport(embedded_broker.url, "publisher", inbox=queue.Queue(), protocol="3.1.1")
    publisher.connect()
    device_b: MqttTransport | None = None
    try:
        assert publisher.publish("edge/v1/devices/a/desired", b"for-a", qos=1, retain=True, wait=5.0)
        assert inbox_a.get(timeout=5).payload == b"for-a"
        device_b, inbox_b = _client(embedded_broker.url, "dev-b", "edge/v1/devices/b/desired")
        late_a, inbox_late = _client(embedded_broker.url, "dev-a-again", "edge/v1/devices/a/desired")
        try:
            assert inbox_late.get(timeout=5).payload == b"for-a"  # its own topic's retained message still arrives
        finally:
            late_a.close()
        time.sleep(1.0)  # what a wrongly offered retained message would need to arrive
        assert [(m.topic, m.payload) for m in list(inbox_b.queue)] == []
    finally:
        for transport in (device_a, publisher, device_b):
            if transport is not None:
                transport.close()
