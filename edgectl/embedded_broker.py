"""The embedded MQTT broker (amqtt) that `edgectl broker` and ./scripts/demo run.

It is a convenience for trying edgectl on one machine: MQTT 3.1.1, plaintext, anonymous, bound
to loopback by default. Fleets use Mosquitto or a clustered broker (see docs/security.md).
While it runs, its URL is written to ``$EDGECTL_HOME/embedded-broker.json`` so that other
edgectl commands find it without a ``--broker`` option.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from pathlib import Path
from typing import Any

from agent.errors import BrokerUnavailable, ConfigError
from edgectl.home import edgectl_home

__all__ = ["discovered_broker_url", "run_embedded_broker"]

log = logging.getLogger(__name__)

_REGISTRATION = "embedded-broker.json"


def _config(host: str, port: int) -> dict[str, Any]:
    return {
        "listeners": {"default": {"type": "tcp", "bind": f"{host}:{port}", "max_connections": 0}},
        "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
    }


def run_embedded_broker(host: str, port: int, register: bool = True) -> None:
    """Run the broker in the foreground until SIGINT or SIGTERM."""
    try:
        from amqtt.broker import Broker
    except ImportError as exc:
        raise ConfigError("the embedded broker needs amqtt: pip install 'edgectl[broker]'") from exc
    registration = edgectl_home() / _REGISTRATION if register else None
    asyncio.run(_serve(Broker, host, port, registration))


async def _serve(broker_class: Any, host: str, port: int, registration: Path | None) -> None:
    broker = broker_class(_config(host, port))  # amqtt binds to the running loop when built
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await broker.start()
    except OSError as exc:
        raise BrokerUnavailable(f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    if registration is not None:
        registration.write_text(json.dumps({"url": f"mqtt://{host}:{port}", "pid": os.getpid()}))
    log.info("embedded broker listening on %s:%d", host, port)
    try:
        await stop.wait()
    finally:
        if registration is not None:
            registration.unlink(missing_ok=True)
        await broker.shutdown()


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
