"""The controller's MQTT connection: it publishes only while this controller leads, and starts afresh when it stops leading.

Every publish (desired states, commands, artifact chunks) passes :meth:`Link.publish`, which asks
``leading()`` first, so a controller that is not the engine leader, or whose lease lapsed while it
was frozen, sends nothing. When leadership is lost, :meth:`Link.renew` drops the connection without
a goodbye and opens a new one: the MQTT client keeps unacknowledged and queued messages and would
send them on its next reconnect (after a network partition heals, say), when another controller
leads; a new client has none. Subscriptions are remembered and made again on the new connection.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from edgecore.transport import ConnectHook, Message, Transport, TransportFactory

__all__ = ["Link"]

log = logging.getLogger(__name__)


class Link:
    """A :class:`~edgecore.transport.Transport` whose publishes are gated by ``leading()``, renewable."""

    def __init__(self, factory: TransportFactory, inbox: queue.Queue[Message], on_connect: ConnectHook,
                 leading: Callable[[], bool]) -> None:
        self._factory, self._inbox, self._hook, self._leading = factory, inbox, on_connect, leading
        self._subs: dict[str, int] = {}
        self._lock = threading.Lock()
        self._transport = factory(inbox, on_connect)
        self.withheld = 0  # publishes refused because this controller did not lead

    @property
    def transport(self) -> Transport:
        return self._transport

    @property
    def connected(self) -> bool:
        return self._transport.connected

    def connect(self, timeout: float = 10.0) -> None:
        self._transport.connect(timeout)

    def wait_connected(self, timeout: float) -> bool:
        return self._transport.wait_connected(timeout)

    def subscribe(self, topic: str, qos: int = 1) -> None:
        with self._lock:
            self._subs[topic] = qos
        self._transport.subscribe(topic, qos)

    def unsubscribe(self, topic: str) -> None:
        with self._lock:
            self._subs.pop(topic, None)
        self._transport.unsubscribe(topic)

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False,
                wait: float | None = None, expiry_s: int | None = None) -> bool:
        if not self._leading():
            self.withheld += 1
            log.debug("not the engine leader: %s not published", topic)
            return False
        return self._transport.publish(topic, payload, qos, retain, wait, expiry_s)

    def close(self, final: tuple[str, bytes] | None = None) -> None:
        self._transport.close(final)

    def abort(self) -> None:
        self._transport.abort()

    def move_on(self, reason: str) -> bool:
        return self._transport.move_on(reason)

    @property
    def shared_subscriptions(self) -> bool:
        """Whether the broker said it honours ``$share/`` subscriptions (MqttTransport's; the memory one has none)."""
        shared: bool = getattr(self._transport, "shared_subscriptions", False)
        return shared

    def renew(self) -> None:
        """Drop this connection unsent (see the module docstring) and connect anew with the same subscriptions.

        Raises ``BrokerUnavailable`` when no broker answers; the new connection is in place either way."""
        old = self._transport
        fresh = self._factory(self._inbox, self._hook)
        with self._lock:
            subs = dict(self._subs)
        for topic, qos in subs.items():
            fresh.subscribe(topic, qos)
        self._transport = fresh
        old.abort()
        log.info("a new broker connection: nothing the old one still held is sent")
        fresh.connect()
