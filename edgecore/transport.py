"""A small MQTT transport over paho-mqtt 2.x (callback API v2) shared by agent and edgectl.

Callbacks run on paho's network thread and only enqueue: slow work (hashing, loading,
benchmarking) happens on the consumer's thread, so keepalive is never starved. Subscriptions are
remembered and renewed on every reconnect. Reconnects back off exponentially with jitter so a
fleet does not stampede a restarted broker. MQTT 5 is tried first (for Maximum Packet Size and
message expiry); brokers that only speak 3.1.1, like the embedded one or NATS, are used with 3.1.1.

A transport may be given several broker URLs, the nodes of one cluster. Each client starts at its
own place in the list, picked by a hash of its client id (stable across restarts, spread across a
fleet: a list given to every device does not put them all on its first node), connects to the
first that answers from there, and when the connection is lost it moves on to the next node in
the list (wrapping around) with the same jittered backoff, renewing its subscriptions there.
:meth:`MqttTransport.move_on` leaves a node that answers but is not the fleet's (the agent decides
that). Retained messages and sessions are the cluster's business (NATS keeps them in replicated
JetStream streams).

``Transport`` is the contract the agent, the controller and the light agents program against;
``MqttTransport`` is the real one and ``edgecore.transport_memory`` an in-memory one for fast tests.
"""

from __future__ import annotations

import hashlib
import logging
import queue
import random
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlparse

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edgecore.errors import BrokerUnavailable, ConfigError

__all__ = [
    "BrokerAddress", "ConnectHook", "DeviceTransportFactory", "Message", "MqttTransport", "Transport", "TransportFactory", "Will",
    "broker_urls", "check_transport_security", "start_index",
]

log = logging.getLogger(__name__)

_UNSUPPORTED_PROTOCOL = {1, 132}  # 3.1.1 and 5 return codes for "unsupported protocol version"


@dataclass(frozen=True)
class BrokerAddress:
    host: str
    port: int
    tls: bool

    @classmethod
    def parse(cls, url: str) -> BrokerAddress:
        parsed = urlparse(url if "://" in url else f"mqtt://{url}")
        if parsed.scheme not in ("mqtt", "mqtts", "tcp", "ssl"):
            raise ConfigError(f"broker URL {url!r}: scheme must be mqtt:// or mqtts://")
        tls = parsed.scheme in ("mqtts", "ssl")
        try:
            port = parsed.port or (8883 if tls else 1883)
        except ValueError as exc:
            raise ConfigError(f"broker URL {url!r}: bad port") from exc
        if not parsed.hostname:
            raise ConfigError(f"broker URL {url!r}: no host")
        return cls(parsed.hostname, port, tls)


def start_index(client_id: str, count: int) -> int:
    """Where in a list of ``count`` brokers this client starts: a stable hash of its id, so a fleet spreads."""
    return int.from_bytes(hashlib.sha256(client_id.encode()).digest()[:8], "big") % max(count, 1)


def broker_urls(spec: str | Sequence[str]) -> list[str]:
    """The broker URLs of ``spec``: one URL, several separated by commas, or a list (of either); in order, once each."""
    items = [spec] if isinstance(spec, str) else list(spec)
    urls = [part.strip() for item in items for part in item.split(",") if part.strip()]
    if not urls:
        raise ConfigError("no broker URL: give mqtt://HOST:PORT, or several separated by commas")
    return list(dict.fromkeys(urls))


_WARNED: set[str] = set()


def check_transport_security(url: str | Sequence[str], insecure: bool, where: str) -> None:
    """Plaintext MQTT is allowed on loopback; elsewhere only with an explicit ``insecure: true``.

    ``url`` may name several brokers (see :func:`broker_urls`): each is checked."""
    urls = broker_urls(url)
    if len(urls) > 1:
        for one in urls:
            check_transport_security(one, insecure, where)
        return
    url = urls[0]
    address = BrokerAddress.parse(url)
    if address.tls:
        return
    if address.host in ("127.0.0.1", "localhost", "::1"):
        if url not in _WARNED:  # one line per process, however often the config is checked
            _WARNED.add(url)
            log.warning("plaintext MQTT on loopback (%s): any local process can publish as any device; "
                        "use mqtts:// with the fleet PKI beyond a single-user test machine", url)
        return
    if not insecure:
        raise ConfigError(
            f"{where}: broker {url} is plaintext; use mqtts:// with tls settings, "
            "or set insecure: true to accept an unencrypted, unauthenticated connection"
        )
    log.warning("plaintext MQTT to %s: traffic is neither encrypted nor authenticated", address.host)


@dataclass(frozen=True)
class Message:
    topic: str
    payload: bytes
    retain: bool


@dataclass(frozen=True)
class Will:
    topic: str
    payload: bytes
    qos: int = 1
    retain: bool = True


class Transport(Protocol):
    """One connection to the fleet's broker, as the agent, the controller and the light agents use it.

    Received messages go to the inbox the transport was built with; the connect hook runs after
    every (re)connect and may only publish (an exception it raises is logged, and the connection
    stays up). Subscriptions are remembered across reconnects."""

    @property
    def connected(self) -> bool: ...

    def connect(self, timeout: float = 10.0) -> None:
        """Connect or raise ``BrokerUnavailable``; reconnects after that happen on their own."""
        ...

    def wait_connected(self, timeout: float) -> bool: ...

    def subscribe(self, topic: str, qos: int = 1) -> None: ...

    def unsubscribe(self, topic: str) -> None: ...

    def publish(
        self, topic: str, payload: bytes, qos: int = 1, retain: bool = False,
        wait: float | None = None, expiry_s: int | None = None,
    ) -> bool:
        """False when not handed over (offline) or, with ``wait``, not acknowledged in time."""
        ...

    def close(self, final: tuple[str, bytes] | None = None) -> None:
        """Publish ``final`` (retained) if connected, then disconnect cleanly: the broker drops the will."""
        ...

    def abort(self) -> None:
        """Go silent without a DISCONNECT, as a crash or a cut cable would: the broker publishes the will."""
        ...

    def move_on(self, reason: str) -> bool:
        """Leave the broker connected to for the next URL of the list, saying ``reason``; False with only one URL."""
        ...


ConnectHook = Callable[[], None]
# (inbox, on_connect) -> an unconnected transport: how the controller is given its connections. Each call must
# give a client id of its own: the controller holds a second connection at times (reconciliation reads the
# retained reports on one), and a broker hands a client id to its newest connection, dropping the older one.
TransportFactory = Callable[[queue.Queue[Message], ConnectHook], Transport]
# (inbox, on_connect, will) -> an unconnected transport: how a device (the agent) is given its connection.
DeviceTransportFactory = Callable[[queue.Queue[Message], ConnectHook, Will], Transport]


class MqttTransport:
    """One MQTT connection: publish, remembered subscriptions, and an inbox of received messages.

    ``url`` is one broker URL or several (a list, or one string separated by commas): the nodes of
    one cluster, tried in order; see the module docstring for failover."""

    def __init__(
        self,
        url: str | Sequence[str],
        client_id: str,
        *,
        inbox: queue.Queue[Message],
        tls_context: ssl.SSLContext | None = None,
        will: Will | None = None,
        on_connect: Callable[[], None] | None = None,
        protocol: str = "auto",
        keepalive: int = 30,
        max_inflight: int = 64,
    ) -> None:
        if protocol not in ("auto", "5", "3.1.1"):
            raise ConfigError(f"mqtt protocol {protocol!r}: use auto, 5 or 3.1.1")
        self.addresses = tuple(BrokerAddress.parse(one) for one in broker_urls(url))
        self._index = start_index(client_id, len(self.addresses))  # the node connected to, or tried next
        self._running = False  # connect() succeeded and neither close() nor abort() since: fail over on loss
        self._refused_while_running = False
        self.failovers = 0  # how often a lost connection moved on to another node
        if any(address.tls for address in self.addresses) and tls_context is None:
            tls_context = ssl.create_default_context()
        self._client_id = client_id
        self._inbox = inbox
        self._tls = tls_context
        self._will = will
        self._hook = on_connect
        self._protocol = protocol
        self._keepalive = keepalive
        self._max_inflight = max_inflight
        self._subs: dict[str, int] = {}
        self._sub_mids: dict[int, str] = {}  # SUBSCRIBEs awaiting their SUBACK
        self._lock = threading.Lock()
        self._connected = threading.Event()
        self._closed = threading.Event()
        self._refused: int | None = None
        self.max_packet_size: int | None = None
        # MQTT 5 brokers say whether they honour $share/ subscriptions (absent: they do); 3.1.1 has none.
        self.shared_subscriptions = False
        self.mqtt_version = "5" if protocol != "3.1.1" else "3.1.1"
        self._client = self._new_client(self.mqtt_version)

    @property
    def address(self) -> BrokerAddress:
        """The broker connected to (or tried next)."""
        return self.addresses[self._index]

    # -- connection -------------------------------------------------------------------------

    def _new_client(self, version: str) -> mqtt.Client:
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=self._client_id,
            protocol=mqtt.MQTTv5 if version == "5" else mqtt.MQTTv311,
            clean_session=None if version == "5" else True,  # MQTT 5 has clean start instead
        )
        client.max_inflight_messages_set(self._max_inflight)
        client.max_queued_messages_set(0)
        client.reconnect_delay_set(min_delay=1, max_delay=30)
        if self._tls is not None:
            client.tls_set_context(self._tls)
        if self._will is not None:
            client.will_set(self._will.topic, self._will.payload, self._will.qos, self._will.retain)
        client.on_connect = self._on_connect
        client.on_connect_fail = self._on_connect_fail
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        client.on_subscribe = self._on_subscribe
        return client

    def connect(self, timeout: float = 10.0) -> None:
        """Connect to the first broker that answers (each falling back from MQTT 5 to 3.1.1 when asked to).

        Starts the network thread; raises ``BrokerUnavailable`` naming every broker tried."""
        failures = []
        for _ in self.addresses:
            reason = self._connect_here(timeout)
            if reason is None:
                self._running = True
                return
            failures.append(f"{self.address.host}:{self.address.port}: {reason}")
            self._index = (self._index + 1) % len(self.addresses)
        if len(failures) == 1:
            raise BrokerUnavailable(f"cannot connect to MQTT broker at {failures[0]}")
        raise BrokerUnavailable(f"cannot connect to any of {len(failures)} MQTT brokers: {'; '.join(failures)}")

    def _connect_here(self, timeout: float) -> str | None:
        """Connect to ``self.address``; None when connected, else why not."""
        try:
            if self._attempt(timeout):
                return None
            # Brokers without MQTT 5 either refuse the version or drop the connection without a CONNACK.
            if self._protocol == "auto" and self.mqtt_version == "5" and (
                    self._refused is None or self._refused in _UNSUPPORTED_PROTOCOL):
                log.info("broker does not speak MQTT 5; using 3.1.1")
                self.mqtt_version = "3.1.1"
                self._client = self._new_client("3.1.1")
                if self._attempt(timeout):
                    return None
        except (OSError, ssl.SSLError) as exc:
            return str(exc)
        return f"refused (code {self._refused})" if self._refused is not None else "no answer"

    def _attempt(self, timeout: float) -> bool:
        self._refused = None
        self._connected.clear()
        self._closed.clear()
        try:
            self._client.connect(self.address.host, self.address.port, keepalive=self._keepalive)
        except (OSError, ssl.SSLError):
            self._client.loop_stop()
            raise
        self._client.loop_start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self._refused is None and not self._closed.is_set():
            if self._connected.wait(0.05):
                return True
        self._client.disconnect()
        self._client.loop_stop()
        return False

    def close(self, final: tuple[str, bytes] | None = None) -> None:
        """Publish ``final`` (topic, payload; retained) if connected, then disconnect cleanly."""
        self._running = False
        if final is not None and self._connected.is_set():
            self.publish(final[0], final[1], qos=1, retain=True, wait=2.0)
        self._client.disconnect()
        self._client.loop_stop()

    def abort(self) -> None:
        """Stop the network thread without a DISCONNECT: the socket stays half-open until keepalive, then the will."""
        self._running = False
        self._client.loop_stop()

    def move_on(self, reason: str) -> bool:
        """Disconnect and connect from the next URL on (raises ``BrokerUnavailable`` when none answers)."""
        if len(self.addresses) < 2:
            return False
        log.warning("leaving broker %s:%s: %s", self.address.host, self.address.port, reason)
        self._running = False
        self._client.disconnect()
        self._client.loop_stop()
        self._index = (self._index + 1) % len(self.addresses)
        self.failovers += 1
        self.connect()
        return True

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def wait_connected(self, timeout: float) -> bool:
        return self._connected.wait(timeout)

    # -- callbacks: network thread, enqueue only ----------------------------------------------

    def _on_connect(self, client: mqtt.Client, _u: Any, _f: Any, reason: Any, props: Properties | None) -> None:
        if reason.is_failure:
            self._refused = int(reason.value)
            self._refused_while_running = self._running  # a node that is up but not serving: try the next
            return
        if props is not None and hasattr(props, "MaximumPacketSize"):
            self.max_packet_size = int(props.MaximumPacketSize)
        self.shared_subscriptions = self.mqtt_version == "5" and int(getattr(props, "SharedSubscriptionAvailable", 1)) == 1
        with self._lock:
            subs = list(self._subs.items())
        for topic, qos in subs:
            self._send_subscribe(client, topic, qos)
        self._connected.set()
        if self._hook is not None:
            try:
                self._hook()
            except Exception:  # paho re-raises a callback's exception on its network thread, which ends the loop
                log.exception("the on-connect hook of %s failed; the connection stays up", self._client_id)

    def _on_disconnect(self, client: mqtt.Client, _u: Any, _f: Any, reason: Any, _p: Any) -> None:
        was_connected = self._connected.is_set()
        self._connected.clear()
        self._closed.set()
        if was_connected:
            # Jitter the next reconnect delay so that a fleet does not reconnect in lockstep; paho
            # doubles it after each failed attempt. paho's stub says int; its backoff arithmetic
            # takes a float, which the jitter needs.
            client.reconnect_delay_set(min_delay=random.uniform(0.5, 1.5), max_delay=30)  # type: ignore[arg-type]
        if was_connected and reason is not None and getattr(reason, "is_failure", False):
            log.warning("disconnected from broker %s:%s (%s); reconnecting with backoff",
                        self.address.host, self.address.port, reason)
        if was_connected or self._refused_while_running:
            self._refused_while_running = False
            self._fail_over(client)

    def _on_connect_fail(self, client: mqtt.Client, _u: Any) -> None:
        """paho's reconnect found no broker listening there (node down): the next attempt goes to the next node."""
        self._fail_over(client)

    def _fail_over(self, client: mqtt.Client) -> None:
        """Point paho's reconnect loop at the next node; it still waits the backoff before connecting."""
        if not self._running or len(self.addresses) == 1:
            return
        self._index = (self._index + 1) % len(self.addresses)
        self.failovers += 1
        log.info("next broker: %s:%s", self.address.host, self.address.port)
        client.connect_async(self.address.host, self.address.port, keepalive=self._keepalive)

    def _on_message(self, _c: mqtt.Client, _u: Any, msg: mqtt.MQTTMessage) -> None:
        self._inbox.put(Message(msg.topic, bytes(msg.payload), bool(msg.retain)))

    def _on_subscribe(self, _c: mqtt.Client, _u: Any, mid: int, reasons: list[Any], _p: Any) -> None:
        """A refused subscription is retried: a cluster node refuses while its JetStream elects a leader."""
        with self._lock:
            topic = self._sub_mids.pop(mid, None)
        if topic is None or not any(getattr(r, "is_failure", False) for r in reasons):
            return
        log.warning("broker refused the subscription to %s (%s); retrying", topic, reasons[0])
        retry = threading.Timer(random.uniform(0.5, 1.5), self._retry_subscribe, (topic,))
        retry.daemon = True
        retry.start()

    def _retry_subscribe(self, topic: str) -> None:
        with self._lock:
            qos = self._subs.get(topic)
        if qos is not None and self._connected.is_set():  # else the next connect subscribes anyway
            self._send_subscribe(self._client, topic, qos)

    def _send_subscribe(self, client: mqtt.Client, topic: str, qos: int) -> None:
        with self._lock:  # held until the mid is recorded, so that its SUBACK cannot be handled first
            result, mid = client.subscribe(topic, qos)
            if result == MQTTErrorCode.MQTT_ERR_SUCCESS and mid is not None:
                self._sub_mids[mid] = topic

    # -- operations ---------------------------------------------------------------------------

    def subscribe(self, topic: str, qos: int = 1) -> None:
        with self._lock:
            self._subs[topic] = qos
        if self._connected.is_set():
            self._send_subscribe(self._client, topic, qos)

    def unsubscribe(self, topic: str) -> None:
        with self._lock:
            self._subs.pop(topic, None)
        if self._connected.is_set():
            self._client.unsubscribe(topic)

    def publish(
        self, topic: str, payload: bytes, qos: int = 1, retain: bool = False,
        wait: float | None = None, expiry_s: int | None = None,
    ) -> bool:
        """Publish; with ``wait``, block up to that many seconds for the broker's ack.

        Returns False when the message could not be handed over (not connected) or was not
        acknowledged in time; QoS 1 messages queued while offline are not kept (callers retry)."""
        props = None
        if expiry_s is not None and self.mqtt_version == "5":
            props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
            props.MessageExpiryInterval = expiry_s
        info = self._client.publish(topic, payload, qos=qos, retain=retain, properties=props)
        if info.rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
            return False
        if wait is None:
            return True
        try:
            info.wait_for_publish(wait)
        except (RuntimeError, ValueError):
            return False
        return info.is_published()
