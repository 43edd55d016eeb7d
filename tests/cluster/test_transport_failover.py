"""MqttTransport with several broker URLs, on three real (separate) Mosquittos: order, failover, subscriptions."""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgecore.errors import BrokerUnavailable, ConfigError
from edgecore.transport import Message, MqttTransport, broker_urls, check_transport_security, start_index
from tests.brokers import BrokerProcess, mosquitto_binary, start_mosquitto
from tests.fleet import wait_for


@pytest.fixture
def three(tmp_path: Path) -> Iterator[list[BrokerProcess]]:
    if mosquitto_binary() is None:
        pytest.fail("mosquitto is not installed: ./scripts/test installs it (apt-get install mosquitto)")
    brokers = [start_mosquitto(tmp_path / f"node-{i}") for i in range(3)]
    yield brokers
    for broker in brokers:
        broker.stop()


def kill(broker: BrokerProcess) -> None:
    assert broker.process is not None
    broker.process.kill()
    broker.process.wait(10)
    broker.process = None


def on(transport: MqttTransport, broker: BrokerProcess) -> bool:
    return transport.connected and transport.address.port == broker.port


def listed(client_id: str, *order: BrokerProcess) -> list[str]:
    """The brokers' URLs placed so that ``client_id`` tries them in ``order``: each client starts where its id hashes to."""
    urls = [""] * len(order)
    first = start_index(client_id, len(order))
    for i, broker in enumerate(order):
        urls[(first + i) % len(order)] = broker.url
    return urls


def publish_to(broker: BrokerProcess, topic: str, payload: bytes) -> None:
    sender = MqttTransport(broker.url, f"sender-{time.monotonic_ns()}", inbox=queue.Queue())
    sender.connect()
    assert sender.publish(topic, payload, wait=5)
    sender.close()


def test_connects_to_the_first_that_answers_then_fails_over_in_list_order_and_renews_subscriptions(
        three: list[BrokerProcess]) -> None:
    a, b, c = three
    kill(a)
    inbox: queue.Queue[Message] = queue.Queue()
    hooks: list[int] = []
    transport = MqttTransport(listed("failover-test", a, b, c), "failover-test", inbox=inbox,
                              on_connect=lambda: hooks.append(transport.address.port))
    transport.connect(timeout=5)
    try:
        assert on(transport, b)  # a is down: the next one in the list
        transport.subscribe("t/#")
        a.start()
        # Losing b moves on to c (next in the list), not back to a; then c wraps around to a.
        for lost, expected in ((b, c), (c, a)):
            kill(lost)
            wait_for(lambda: on(transport, expected), 20, f"failover to port {expected.port}")  # noqa: B023
            lost.start()
            publish_to(expected, "t/x", lost.url.encode())
            assert inbox.get(timeout=5).payload == lost.url.encode()  # subscription renewed on the new node
        assert hooks == [b.port, c.port, a.port]  # the connect hook ran on each node
        assert transport.failovers == 2
    finally:
        transport.close()


def test_two_nodes_down_in_a_row_are_skipped(three: list[BrokerProcess]) -> None:
    a, b, c = three
    transport = MqttTransport(", ".join(listed("skip-test", a, b, c)), "skip-test", inbox=queue.Queue())
    transport.connect(timeout=5)
    try:
        assert on(transport, a)
        kill(b)
        kill(a)
        wait_for(lambda: on(transport, c), 30, "failover past the dead b to c")
    finally:
        transport.close()


def test_a_lost_connection_moves_on_even_when_the_old_node_is_back_at_once(three: list[BrokerProcess]) -> None:
    a, b, _ = three
    transport = MqttTransport(listed("moves-on", a, b), "moves-on", inbox=queue.Queue())
    transport.connect(timeout=5)
    try:
        assert on(transport, a)
        a.restart()  # back before the reconnect backoff (at least 0.5 s) is over
        wait_for(lambda: on(transport, b), 20, "failover to b")
    finally:
        transport.close()


def test_a_list_spreads_clients_over_the_nodes_each_client_on_the_same_node_every_time(three: list[BrokerProcess]) -> None:
    urls = [broker.url for broker in three]
    ports = []
    for i in range(12):
        transport = MqttTransport(urls, f"device-{i:03d}", inbox=queue.Queue())
        transport.connect(timeout=5)
        try:
            ports.append(transport.address.port)
        finally:
            transport.close()
    assert {broker.port for broker in three} == set(ports)  # not every client on the first URL
    assert start_index("device-007", 3) == start_index("device-007", 3) == [b.port for b in three].index(ports[7])
    assert start_index("any", 1) == 0 and start_index("any", 0) == 0


def test_one_url_reconnects_to_the_same_broker(three: list[BrokerProcess]) -> None:
    a = three[0]
    transport = MqttTransport(a.url, "single", inbox=queue.Queue())
    transport.connect(timeout=5)
    try:
        a.restart(down_for=0.5)
        wait_for(lambda: on(transport, a), 20, "reconnect to the only broker")
        assert transport.failovers == 0
    finally:
        transport.close()


def test_no_broker_answers_names_every_one(three: list[BrokerProcess]) -> None:
    urls = [broker.url for broker in three]
    for broker in three:
        broker.stop()
    with pytest.raises(BrokerUnavailable) as error:
        MqttTransport(urls, "nobody", inbox=queue.Queue()).connect(timeout=2)
    assert "cannot connect to any of 3 MQTT brokers" in str(error.value)
    assert all(f"127.0.0.1:{broker.port}" in str(error.value) for broker in three)


def test_broker_lists_are_parsed_in_order_once_each_and_checked_one_by_one() -> None:
    assert broker_urls("mqtt://a:1, mqtt://b:2,,mqtt://a:1") == ["mqtt://a:1", "mqtt://b:2"]
    assert broker_urls(["mqtt://a:1,mqtt://b:2", "mqtt://c:3"]) == ["mqtt://a:1", "mqtt://b:2", "mqtt://c:3"]
    with pytest.raises(ConfigError, match="no broker URL"):
        broker_urls(" , ")
    with pytest.raises(ConfigError, match="mqtt://far:1883 is plaintext"):
        check_transport_security("mqtts://near:8883,mqtt://far:1883", insecure=False, where="test")
    with pytest.raises(ConfigError, match="scheme must be"):
        MqttTransport("mqtt://a:1,http://b:2", "x", inbox=queue.Queue())
