"""A subscription the broker refuses (SUBACK 0x80) is retried until granted.

A NATS node refuses subscriptions for a few seconds after a cluster member dies (JetStream has no
stream leader yet), but not on demand; so the peer here is a minimal MQTT 3.1.1 server on a real
socket, reached through the transport's ordinary seam, its URL, that refuses the first SUBSCRIBE.
"""

from __future__ import annotations

import queue
import socket
import threading
from collections.abc import Iterator

import pytest

from edgecore.transport import Message, MqttTransport


def _read_packet(conn: socket.socket) -> tuple[int, bytes]:
    header = conn.recv(1)
    if not header:
        raise ConnectionError("closed")
    length, shift = 0, 0
    while True:
        byte = conn.recv(1)[0]
        length |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
    body = b""
    while len(body) < length:
        body += conn.recv(length - len(body))
    return header[0] >> 4, body


class RefusingBroker:
    """Accepts one client; refuses its first SUBSCRIBE, grants later ones and then publishes on the topic."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.subscribes = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.server.accept()
        with conn:
            try:
                while True:
                    kind, body = _read_packet(conn)
                    if kind == 1:  # CONNECT
                        conn.sendall(b"\x20\x02\x00\x00")
                    elif kind == 8:  # SUBSCRIBE: packet id, then (topic, qos)
                        self.subscribes += 1
                        topic = body[4:4 + int.from_bytes(body[2:4], "big")]
                        granted = b"\x80" if self.subscribes == 1 else b"\x01"
                        conn.sendall(b"\x90\x03" + body[:2] + granted)
                        if self.subscribes > 1:
                            payload = len(topic).to_bytes(2, "big") + topic + b"granted"
                            conn.sendall(bytes([0x30, len(payload)]) + payload)
                    elif kind == 12:  # PINGREQ
                        conn.sendall(b"\xd0\x00")
                    elif kind == 14:  # DISCONNECT
                        return
            except (ConnectionError, OSError, IndexError):
                return

    def close(self) -> None:
        self.server.close()


@pytest.fixture
def refusing() -> Iterator[RefusingBroker]:
    broker = RefusingBroker()
    yield broker
    broker.close()


def test_a_refused_subscription_is_retried_until_granted(refusing: RefusingBroker) -> None:
    inbox: queue.Queue[Message] = queue.Queue()
    transport = MqttTransport(f"mqtt://127.0.0.1:{refusing.port}", "retry", inbox=inbox, protocol="3.1.1")
    transport.connect(timeout=5)
    try:
        transport.subscribe("edge/v1/devices/cam-1/desired")
        message = inbox.get(timeout=10)
        assert message.payload == b"granted" and refusing.subscribes == 2
    finally:
        transport.close()
