"""Connecting edgectl to the fleet's broker: flag, config, or the embedded broker on this machine.

The broker may be a cluster: ``--broker`` (repeated or comma-separated) or the config's ``brokers``
list names its nodes, and the transport fails over between them (``edgecore.transport``).

Every command that connects goes through :func:`checked_broker`: plaintext MQTT off loopback needs
``insecure: true``; on loopback it is allowed with one warning line per process
(``edgecore.transport.check_transport_security``).
"""

from __future__ import annotations

import os
import queue
import uuid

from edgecore.errors import BrokerUnavailable
from edgecore.tls import tls_context
from edgecore.transport import (
    ConnectHook,
    Message,
    MqttTransport,
    Transport,
    TransportFactory,
    broker_urls,
    check_transport_security,
)
from edgectl.config import EdgectlConfig
from edgectl.embedded_broker import discovered_broker_url

__all__ = ["checked_broker", "controller_transports", "open_transport", "resolve_broker"]


def resolve_broker(flag: str | None, config: EdgectlConfig) -> str:
    """The broker URLs to use, comma-separated: ``--broker``, else the config, else the embedded broker."""
    url = flag or ",".join(config.brokers) or config.broker or discovered_broker_url()
    if url is None:
        raise BrokerUnavailable(
            "no broker: pass --broker mqtt://HOST:PORT, set broker in edgectl.yaml, or start one with `edgectl broker`"
        )
    return ",".join(broker_urls(url))


def checked_broker(flag: str | None, config: EdgectlConfig) -> str:
    """The broker URLs (comma-separated), refused when one is plaintext off loopback without ``insecure: true``."""
    url = resolve_broker(flag, config)
    check_transport_security(url, config.insecure, "edgectl config")
    return url


def open_transport(flag: str | None, config: EdgectlConfig, inbox: queue.Queue[Message], role: str = "cli") -> MqttTransport:
    """A connected transport for this edgectl process."""
    url = checked_broker(flag, config)
    tls = tls_context(config.tls.ca, config.tls.cert, config.tls.key) if config.tls.ca else None
    client_id = f"edgectl-{role}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    transport = MqttTransport(url, client_id, inbox=inbox, tls_context=tls, protocol=config.mqtt_protocol)
    transport.connect()
    return transport


def controller_transports(url: str, config: EdgectlConfig) -> TransportFactory:
    """How ``edgectl controller run`` builds its (unconnected) transport; ``url`` from :func:`checked_broker`."""
    tls = tls_context(config.tls.ca, config.tls.cert, config.tls.key) if config.tls.ca else None

    def build(inbox: queue.Queue[Message], on_connect: ConnectHook) -> Transport:
        return MqttTransport(url, f"edgectl-controller-{os.getpid()}-{uuid.uuid4().hex[:6]}", inbox=inbox,
                             tls_context=tls, on_connect=on_connect, protocol=config.mqtt_protocol)

    return build
