"""Connecting edgectl to the fleet's broker: flag, config, or the embedded broker on this machine."""

from __future__ import annotations

import os
import queue
import uuid

from agent.errors import BrokerUnavailable
from agent.tls import tls_context
from agent.transport import Message, MqttTransport, check_transport_security
from edgectl.config import EdgectlConfig
from edgectl.embedded_broker import discovered_broker_url

__all__ = ["open_transport", "resolve_broker"]


def resolve_broker(flag: str | None, config: EdgectlConfig) -> str:
    url = flag or config.broker or discovered_broker_url()
    if url is None:
        raise BrokerUnavailable(
            "no broker: pass --broker mqtt://HOST:PORT, set broker in edgectl.yaml, or start one with `edgectl broker`"
        )
    return url


def open_transport(flag: str | None, config: EdgectlConfig, inbox: queue.Queue[Message], role: str = "cli") -> MqttTransport:
    """A connected transport for this edgectl process."""
    url = resolve_broker(flag, config)
    check_transport_security(url, config.insecure, "edgectl config")
    tls = tls_context(config.tls.ca, config.tls.cert, config.tls.key) if config.tls.ca else None
    client_id = f"edgectl-{role}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    transport = MqttTransport(url, client_id, inbox=inbox, tls_context=tls, protocol=config.mqtt_protocol)
    transport.connect()
    return transport
