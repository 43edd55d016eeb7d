"""A connect hook that raises is logged and the connection keeps working, on a real Mosquitto and in memory.

paho re-raises a callback's exception on its network thread, which ends the loop: without the
catch in ``MqttTransport._on_connect`` no message arrives after the first connect and no
reconnect ever happens.
"""

from __future__ import annotations

import logging
import queue

import pytest

from edgecore.transport import Message, MqttTransport
from edgecore.transport_memory import MemoryBroker
from tests.brokers import BrokerProcess
from tests.fleet import wait_for


class Failing:
    """A connect hook that counts its calls and raises on every one."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1
        raise RuntimeError(f"hook failure #{self.calls}")


def test_a_raising_hook_leaves_the_mqtt_connection_working_across_a_reconnect(
        mosquitto: BrokerProcess, caplog: pytest.LogCaptureFixture) -> None:
    inbox: queue.Queue[Message] = queue.Queue()
    hook = Failing()
    transport = MqttTransport(mosquitto.url, "hook-raises", inbox=inbox, on_connect=hook)
    sender = MqttTransport(mosquitto.url, "hook-sender", inbox=queue.Queue())
    transport.subscribe("hook/t")
    with caplog.at_level(logging.ERROR, logger="edgecore.transport"):
        transport.connect()
        sender.connect()
        try:
            _still_works(transport, sender, inbox, hook, 1)
            mosquitto.restart(down_for=0.5)  # paho's loop reconnects only if it is still running
            wait_for(lambda: sender.connected, 30, "the sender back")
            _still_works(transport, sender, inbox, hook, 2)
        finally:
            transport.close()
            sender.close()
    assert "hook failure #1" in caplog.text and "hook failure #2" in caplog.text


def test_a_raising_hook_leaves_the_memory_connection_working() -> None:
    broker, hook = MemoryBroker(), Failing()
    transport = broker.transport("hook-raises", on_connect=hook)
    transport.subscribe("hook/t")
    transport.connect()
    broker.stop()
    broker.start()
    sender = broker.transport("sender")
    sender.connect()
    assert hook.calls == 2 and transport.connected and sender.publish("hook/t", b"x")
    assert transport.inbox.get_nowait() == Message("hook/t", b"x", False)


def _still_works(transport: MqttTransport, sender: MqttTransport, inbox: queue.Queue[Message], hook: Failing,
                 connects: int) -> None:
    wait_for(lambda: hook.calls == connects and transport.connected, 30, f"connect #{connects} with its hook run")
    text = f"after connect #{connects}"
    wait_for(lambda: sender.publish("hook/t", text.encode(), wait=2.0) and _received(inbox, text), 20, f"a message {text}")


def _received(inbox: queue.Queue[Message], text: str) -> bool:
    try:
        return inbox.get(timeout=1.0).payload == text.encode()
    except queue.Empty:
        return False
