"""The in-memory broker keeps the MQTT behaviour the agent and the controller rely on."""

from __future__ import annotations

import queue

import pytest

from edgecore.errors import BrokerUnavailable
from edgecore.transport import DeviceTransportFactory, Message, Transport, TransportFactory, Will
from edgecore.transport_memory import MemoryBroker, MemoryTransport, check_filter, topic_matches


def drain(inbox: queue.Queue[Message]) -> list[Message]:
    out = []
    while not inbox.empty():
        out.append(inbox.get_nowait())
    return out


def connected(broker: MemoryBroker, client_id: str, *filters: str, will: Will | None = None) -> MemoryTransport:
    client = broker.transport(client_id, will=will)
    for f in filters:
        client.subscribe(f)
    client.connect()
    return client


@pytest.mark.parametrize(("topic_filter", "topic", "expected"), [
    ("edge/v1/devices/+/events", "edge/v1/devices/d1/events", True),
    ("edge/v1/devices/+/events", "edge/v1/devices/d1/state", False),
    ("edge/v1/devices/+/events", "edge/v1/devices/d1/events/x", False),
    ("edge/v1/#", "edge/v1/devices/d1/events", True),
    ("edge/v1/#", "edge/v1", True),  # '#' also matches the parent level
    ("edge/+", "edge/v1/devices", False),
    ("#", "$SYS/broker/uptime", False),  # wildcards at the start do not reach $-topics
    ("+/broker/uptime", "$SYS/broker/uptime", False),
    ("$SYS/#", "$SYS/broker/uptime", True),
    ("a/b", "a/b", True),
    ("a/b", "a/c", False),
])
def test_topic_filters(topic_filter: str, topic: str, expected: bool) -> None:
    assert topic_matches(topic_filter, topic) is expected


@pytest.mark.parametrize("bad", ["", "a/#/b", "a/b#", "a/+b/c"])
def test_bad_filters_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        check_filter(bad)


def test_fits_both_factory_seams() -> None:
    broker = MemoryBroker()
    controller: TransportFactory = broker.factory("controller")
    device: DeviceTransportFactory = broker.factory("device")
    made: list[Transport] = [controller(queue.Queue(), lambda: None), device(queue.Queue(), lambda: None, Will("t", b"x"))]
    assert [isinstance(t, MemoryTransport) for t in made] == [True, True]


def test_publish_reaches_matching_subscribers_once_each() -> None:
    broker = MemoryBroker()
    both = connected(broker, "both", "edge/v1/devices/+/events", "edge/v1/#")
    other = connected(broker, "other", "edge/v1/devices/+/state")
    sender = connected(broker, "sender")
    assert sender.publish("edge/v1/devices/d1/events", b"e1")
    assert drain(both.inbox) == [Message("edge/v1/devices/d1/events", b"e1", False)]
    assert drain(other.inbox) == []


def test_retained_messages_go_to_later_subscribers_flagged_retained() -> None:
    broker = MemoryBroker()
    sender = connected(broker, "sender")
    sender.publish("edge/v1/devices/d1/desired", b"v1", retain=True)
    sender.publish("edge/v1/devices/d1/desired", b"v2", retain=True)
    late = connected(broker, "late", "edge/v1/devices/d1/#")
    assert drain(late.inbox) == [Message("edge/v1/devices/d1/desired", b"v2", True)]
    sender.publish("edge/v1/devices/d1/desired", b"v3", retain=True)  # live delivery: not flagged
    assert drain(late.inbox) == [Message("edge/v1/devices/d1/desired", b"v3", False)]
    sender.publish("edge/v1/devices/d1/desired", b"", retain=True)  # an empty retained payload clears it
    assert broker.retained("edge/v1/devices/d1/desired") is None


def test_offline_publish_is_refused_and_lost() -> None:
    broker = MemoryBroker()
    listener = connected(broker, "listener", "t")
    offline = broker.transport("offline")
    assert not offline.publish("t", b"x")
    assert drain(listener.inbox) == []


def test_wills_go_out_on_abort_and_drop_but_not_on_close() -> None:
    broker = MemoryBroker()
    watcher = connected(broker, "watcher", "presence/+")
    transports = {name: connected(broker, name, will=Will(f"presence/{name}", b"offline"))
                  for name in ("aborted", "dropped", "closed")}
    transports["aborted"].abort()
    broker.drop("dropped")
    transports["closed"].close(final=("presence/closed", b"bye"))
    assert [(m.topic, m.payload) for m in drain(watcher.inbox)] == [
        ("presence/aborted", b"offline"), ("presence/dropped", b"offline"), ("presence/closed", b"bye")]
    assert broker.clients() == ["watcher"]


def test_a_restart_loses_retained_state_and_clients_resubscribe_and_rerun_their_hook() -> None:
    broker = MemoryBroker()
    hooks: list[str] = []
    device = broker.transport("device", on_connect=lambda: hooks.append("connected"))
    device.subscribe("desired")
    device.connect()
    sender = connected(broker, "sender")
    sender.publish("desired", b"old", retain=True)
    broker.stop()
    assert not device.connected and not sender.publish("desired", b"lost")
    with pytest.raises(BrokerUnavailable):
        broker.transport("late").connect()
    broker.start()
    assert device.connected and sender.connected and hooks == ["connected", "connected"]
    drain(device.inbox)
    sender.publish("desired", b"new")
    assert drain(device.inbox) == [Message("desired", b"new", False)]  # the subscription survived the restart
    assert broker.retained("desired") is None


def test_unsubscribe_stops_delivery_and_wildcards_cannot_be_published() -> None:
    broker = MemoryBroker()
    client = connected(broker, "c", "t/+")
    client.unsubscribe("t/+")
    client.publish("t/1", b"x")
    assert drain(client.inbox) == []
    with pytest.raises(ValueError):
        client.publish("t/+", b"x")
