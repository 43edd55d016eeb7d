"""The embedded MQTT broker (amqtt) that `edgectl broker` runs, and ./scripts/demo where Mosquitto is missing.

It is a convenience for trying edgectl on one machine: MQTT 3.1.1, plaintext, anonymous, bound
to loopback by default. Fleets use Mosquitto or a clustered broker (see docs/security.md).
While it runs, its URL is written to ``$EDGECTL_HOME/embedded-broker.json`` so that other
edgectl commands find it without a ``--broker`` option.

Two things amqtt 0.12 gets wrong are put right here, in front of it and around it:

- **MQTT 5 clients are refused at once.** amqtt misreads an MQTT 5 CONNECT that carries a will (its
  properties shift every field after them) and waits for bytes that never come, so each client stalled
  10 s before falling back to 3.1.1. We accept the connection ourselves (amqtt's ``external``
  listener), read the CONNECT's protocol level, answer anything but 3.1.1 with CONNACK "unacceptable
  protocol version" (0x01) and hand the rest, unread bytes replayed, to amqtt.
- **Retained messages go to the topics subscribed.** On every connection amqtt offered the new client
  the retained messages of every filter *any* client had subscribed (a simulated device received other
  devices' desired states and reported them rejected); :class:`_Broker` delivers a retained message only
  on a subscription the client itself holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
from pathlib import Path
from typing import Any

from edgecore.errors import BrokerUnavailable, ConfigError
from edgectl.home import edgectl_home

__all__ = ["discovered_broker_url", "run_embedded_broker"]

log = logging.getLogger(__name__)

_REGISTRATION = "embedded-broker.json"
_LISTENER = "default"
_MQTT_311 = 4
_CONNACK_UNACCEPTABLE_VERSION = b"\x20\x02\x00\x01"
_CONNECT_TIMEOUT_S = 10.0  # a connection that sends no CONNECT header within this is closed


def _config() -> dict[str, Any]:
    return {
        "listeners": {_LISTENER: {"type": "external", "max_connections": 0}},
        "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
    }


def run_embedded_broker(host: str, port: int, register: bool = True) -> None:
    """Run the broker in the foreground until SIGINT or SIGTERM."""
    try:
        import amqtt.broker  # noqa: F401
    except ImportError as exc:
        raise ConfigError("the embedded broker needs amqtt: pip install 'edgectl[broker]'") from exc
    registration = edgectl_home() / _REGISTRATION if register else None
    asyncio.run(_serve(host, port, registration))


async def _serve(host: str, port: int, registration: Path | None) -> None:
    broker = _broker_class()(_config())  # amqtt binds to the running loop when built
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await broker.start()
    try:
        server = await asyncio.start_server(lambda r, w: _accept(broker, r, w), host, port)
    except OSError as exc:
        await broker.shutdown()
        raise BrokerUnavailable(f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    if registration is not None:
        registration.write_text(json.dumps({"url": f"mqtt://{host}:{port}", "pid": os.getpid()}))
    log.info("embedded broker listening on %s:%d", host, port)
    try:
        await stop.wait()
    finally:
        if registration is not None:
            registration.unlink(missing_ok=True)
        server.close()
        await broker.shutdown()


async def _accept(broker: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Refuse what amqtt cannot read (anything but MQTT 3.1.1); give amqtt the rest."""
    from amqtt.adapters import StreamWriterAdapter

    try:
        head, level = await asyncio.wait_for(_connect_head(reader), _CONNECT_TIMEOUT_S)
    except (asyncio.IncompleteReadError, asyncio.TimeoutError, ConnectionError, ValueError):
        writer.close()
        return
    if level != _MQTT_311:
        writer.write(_CONNACK_UNACCEPTABLE_VERSION)
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()
        return
    await broker.external_connected(_Replay(reader, head), StreamWriterAdapter(writer), _LISTENER)


async def _connect_head(reader: asyncio.StreamReader) -> tuple[bytes, int]:
    """The CONNECT's bytes up to its protocol level (kept, to replay) and the level; ValueError if not a CONNECT."""
    head = await reader.readexactly(1)
    if head[0] >> 4 != 1:
        raise ValueError("the first packet is not a CONNECT")
    for _ in range(4):  # the remaining length: 1 to 4 bytes, the high bit says another follows
        byte = await reader.readexactly(1)
        head += byte
        if not byte[0] & 0x80:
            break
    size = await reader.readexactly(2)
    name = await reader.readexactly(int.from_bytes(size, "big"))
    level = await reader.readexactly(1)
    return head + size + name + level, level[0]


def _broker_class() -> Any:
    """amqtt's Broker, delivering a retained message only on a subscription the connecting client holds."""
    from amqtt.broker import Broker

    class _Broker(Broker):  # type: ignore[misc]  # amqtt is untyped for mypy here
        async def _publish_retained_messages_for_subscription(self, subscription: tuple[str, int], session: Any) -> None:
            holders = self._subscriptions.get(subscription[0], ())
            if any(held.client_id == session.client_id for held, _qos in holders):
                await super()._publish_retained_messages_for_subscription(subscription, session)

    return _Broker


class _Replay:
    """amqtt's reader interface over the stream, giving back first the bytes :func:`_connect_head` took."""

    def __init__(self, reader: asyncio.StreamReader, head: bytes) -> None:
        self._reader = reader
        self._head = head

    async def read(self, n: int = -1) -> bytes:
        if self._head:
            if n == -1:
                data, self._head = self._head + await self._reader.read(-1), b""
                return data
            taken, self._head = self._head[:n], self._head[n:]
            return taken + (await self._reader.readexactly(n - len(taken)) if n > len(taken) else b"")
        return await (self._reader.read(n) if n == -1 else self._reader.readexactly(n))

    def feed_eof(self) -> None:
        self._reader.feed_eof()


def discovered_broker_url() -> str | None:
    """URL of the embedded broker started by `edgectl broker` on this machine, if it still runs."""
    path = edgectl_home() / _REGISTRATION
    try:
        data = json.loads(path.read_text())
        pid, url = int(data["pid"]), str(data["url"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return url
