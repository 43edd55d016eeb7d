"""An MQTT broker and transport in memory: the injectable fake for tests without a broker process.

Like httpx's ``MockTransport``, this is a public seam, not a patch: give an ``Agent`` or a
``Controller`` a transport factory from ``MemoryBroker.factory`` and it runs its real dispatch
against a broker that lives in the test's process.

What it keeps of MQTT: topic filters with ``+`` and ``#`` (``$``-topics are not matched by a
leading wildcard), retained messages (an empty retained payload clears one; a message is flagged
``retain`` only when it is delivered because of a new subscription, as Mosquitto does), one copy
per client however many of its filters match, subscriptions renewed on reconnect, the connect
hook after every (re)connect (one that raises is logged), last wills on ``abort`` or ``drop``, and no will on a clean ``close``.
Every publish is delivered at once, in order, to each subscriber's inbox (QoS 0 and 1 alike, never
lost while both ends are connected); publishing while disconnected returns False and drops the
message, like ``MqttTransport``. Not modelled: QoS 2 handshakes, message expiry, packet size
limits, shared subscriptions, keepalive timing (a will is sent at once).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from edgecore.errors import BrokerUnavailable
from edgecore.transport import ConnectHook, Message, Will

__all__ = ["MemoryBroker", "MemoryTransport", "check_filter", "topic_matches"]

log = logging.getLogger(__name__)


def check_filter(topic_filter: str) -> None:
    """Raise ValueError unless ``topic_filter`` is a valid MQTT filter (``+`` and ``#`` as whole levels, ``#`` last)."""
    levels = topic_filter.split("/")
    if not topic_filter:
        raise ValueError("empty topic filter")
    for i, level in enumerate(levels):
        if ("+" in level or "#" in level) and len(level) > 1:
            raise ValueError(f"topic filter {topic_filter!r}: a wildcard must be a whole level")
        if level == "#" and i != len(levels) - 1:
            raise ValueError(f"topic filter {topic_filter!r}: '#' must be the last level")


def topic_matches(topic_filter: str, topic: str) -> bool:
    """Whether ``topic`` matches ``topic_filter`` under MQTT's rules."""
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    want, have = topic_filter.split("/"), topic.split("/")
    for i, level in enumerate(want):
        if level == "#":
            return True
        if i >= len(have) or (level != "+" and level != have[i]):
            return False
    return len(want) == len(have)


class MemoryBroker:
    """Routes publishes between ``MemoryTransport`` clients in this process; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._clients: dict[str, MemoryTransport] = {}
        self._retained: dict[str, bytes] = {}
        self._down: list[MemoryTransport] = []  # lost their connection, will reconnect at start()
        self.running = True

    def transport(self, client_id: str, inbox: queue.Queue[Message] | None = None,
                  on_connect: ConnectHook | None = None, will: Will | None = None) -> MemoryTransport:
        """A new, unconnected client of this broker."""
        return MemoryTransport(self, client_id, inbox if inbox is not None else queue.Queue(), on_connect, will)

    def factory(self, client_id: str) -> Callable[..., MemoryTransport]:
        """A ``TransportFactory`` / ``DeviceTransportFactory``: (inbox, on_connect[, will]) -> a client named ``client_id``."""
        def build(inbox: queue.Queue[Message], on_connect: ConnectHook, will: Will | None = None) -> MemoryTransport:
            return self.transport(client_id, inbox, on_connect, will)
        return build

    def retained(self, topic: str) -> bytes | None:
        with self._lock:
            return self._retained.get(topic)

    def clients(self) -> list[str]:
        """The ids of the connected clients."""
        with self._lock:
            return sorted(self._clients)

    def subscribed(self, client_id: str, topic: str) -> bool:
        """Whether the connected client ``client_id`` would receive a message published on ``topic`` now (a client
        that subscribes once connected, as the controller does, shows as connected a moment before that)."""
        with self._lock:
            client = self._clients.get(client_id)
        return client is not None and client._wants(topic)

    # -- faults -----------------------------------------------------------------------------------

    def drop(self, client_id: str) -> None:
        """Lose one client's connection as a network failure would: its will goes out; it reconnects at ``start``."""
        with self._lock:
            client = self._clients.get(client_id)
        if client is not None:
            client._lost()
            self._detach(client, client.will)
            with self._lock:
                self._down.append(client)

    def stop(self) -> None:
        """The broker goes away: every client is disconnected (no wills); connecting fails until ``start``.

        Retained messages are lost, as with Mosquitto without persistence."""
        with self._lock:
            self.running = False
            self._retained.clear()
            clients = list(self._clients.values())
            self._clients.clear()
        for client in clients:
            client._lost()
            self._down.append(client)

    def start(self) -> None:
        """The broker is back: every client that lost its connection (stop, drop) reconnects and runs its hook."""
        with self._lock:
            self.running = True
            clients, self._down = self._down, []
        for client in clients:
            client._resume()

    # -- what the transports call -----------------------------------------------------------------

    def _attach(self, client: MemoryTransport) -> None:
        with self._lock:
            if not self.running:
                raise BrokerUnavailable(f"memory broker: not running, {client.client_id} cannot connect")
            old = self._clients.get(client.client_id)
            self._clients[client.client_id] = client
        if old is not None and old is not client:  # MQTT: a second connection with the same id takes over
            old._lost()

    def _detach(self, client: MemoryTransport, will: Will | None) -> None:
        with self._lock:
            if self._clients.get(client.client_id) is not client:
                return
            del self._clients[client.client_id]
        if will is not None:
            self._route(will.topic, will.payload, will.retain)

    def _route(self, topic: str, payload: bytes, retain: bool) -> None:
        if not topic or "+" in topic or "#" in topic:
            raise ValueError(f"publish topic {topic!r}: must be non-empty and without wildcards")
        with self._lock:
            if retain:
                if payload:
                    self._retained[topic] = payload
                else:
                    self._retained.pop(topic, None)
            for client in self._clients.values():
                if client._wants(topic):
                    client._deliver(Message(topic, payload, False))

    def _send_retained(self, client: MemoryTransport, *filters: str) -> None:
        """Hand ``client`` the retained messages its new ``filters`` match, each once."""
        with self._lock:
            for topic, payload in sorted(self._retained.items()):
                if any(topic_matches(f, topic) for f in filters):
                    client._deliver(Message(topic, payload, True))


class MemoryTransport:
    """A ``Transport`` on a ``MemoryBroker``: same contract as ``MqttTransport``, no sockets, no threads."""

    def __init__(self, broker: MemoryBroker, client_id: str, inbox: queue.Queue[Message],
                 on_connect: ConnectHook | None = None, will: Will | None = None) -> None:
        self.broker = broker
        self.client_id = client_id
        self.inbox = inbox
        self.will = will
        self._hook = on_connect
        self._subs: dict[str, int] = {}
        self._connected = threading.Event()
        self._wanted = False  # connect() was called and neither close() nor abort() since: start() reconnects it
        self._lock = threading.Lock()

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def connect(self, timeout: float = 10.0) -> None:
        self.broker._attach(self)
        self._wanted = True
        self._up()

    def wait_connected(self, timeout: float) -> bool:
        return self._connected.wait(timeout)

    def subscribe(self, topic: str, qos: int = 1) -> None:
        check_filter(topic)
        with self._lock:
            self._subs[topic] = qos
        if self.connected:
            self.broker._send_retained(self, topic)

    def unsubscribe(self, topic: str) -> None:
        with self._lock:
            self._subs.pop(topic, None)

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False,
                wait: float | None = None, expiry_s: int | None = None) -> bool:
        if qos not in (0, 1, 2):
            raise ValueError(f"qos {qos}: use 0, 1 or 2")
        if not self.connected:
            return False
        self.broker._route(topic, bytes(payload), retain)
        return True

    def close(self, final: tuple[str, bytes] | None = None) -> None:
        if final is not None and self.connected:
            self.publish(final[0], final[1], qos=1, retain=True)
        self._wanted = False
        self._connected.clear()
        self.broker._detach(self, None)

    def abort(self) -> None:
        self._wanted = False
        self._connected.clear()
        self.broker._detach(self, self.will)

    def move_on(self, reason: str) -> bool:
        return False  # one broker, nowhere else to go

    # -- what the broker calls --------------------------------------------------------------------

    def _wants(self, topic: str) -> bool:
        with self._lock:
            return any(topic_matches(f, topic) for f in self._subs)

    def _deliver(self, message: Message) -> None:
        self.inbox.put(message)

    def _up(self) -> None:
        with self._lock:
            filters = list(self._subs)
        self.broker._send_retained(self, *filters)
        self._connected.set()
        if self._hook is not None:
            try:
                self._hook()
            except Exception:  # as MqttTransport: a failing hook is logged, the connection stays up
                log.exception("the on-connect hook of %s failed; the connection stays up", self.client_id)

    def _lost(self) -> None:
        self._connected.clear()

    def _resume(self) -> None:
        """The broker is back: reconnect as paho's loop would, unless closed or aborted meanwhile."""
        if self._wanted and not self.connected:
            self.broker._attach(self)
            self._up()
