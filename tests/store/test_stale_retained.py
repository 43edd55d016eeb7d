"""A retained copy older than what was stored live never replaces it (on a resubscription or in reconciliation).

A NATS node's view of the retained messages lags the stream the other nodes write to: a controller
that subscribes there (again, or through the reconciler's short connection) can be handed a device's
previous state after the new one arrived live. Ordered by arrival, that copy would put the old model
back in the store, where it stayed until the device's next change (the HA stack's "v2 everywhere"
check saw v1 for 30 s). Retained births and states are ordered by the device's own clock against the
stored one; live reports still go by arrival.
"""

from __future__ import annotations

from edgecore.protocol import topics
from edgecore.protocol.reports import Birth, DeviceState, RunningModel
from edgecore.transport import Message
from edgectl.controller.clock import StoreClock
from edgectl.controller.inbox import Received
from edgectl.controller.ingest import Ingest
from edgectl.controller.reconcile import reconcile
from tests.store.conftest import MakeStore


def _state(version: int, claimed: float, retain: bool) -> Message:
    state = DeviceState.of_set("d1", claimed, (RunningModel("det", version, f"art-{version}"),), None, version, None)
    return Message(topics.device("d1", "state"), state.to_payload(), retain)


def _stored_version(ingest: Ingest) -> int | None:
    device = ingest.store.device("d1")
    assert device is not None and device.active is not None
    return device.active.version


def test_a_stale_retained_state_after_the_live_one_is_dropped_and_counted(make_store: MakeStore) -> None:
    a, b = Ingest(make_store()), Ingest(make_store(cache="cache-b"))
    a.apply(_state(1, 1000.0, retain=False), 2000.0)
    a.apply(_state(2, 1010.0, retain=False), 2010.0)  # the new model, live
    assert b.apply(_state(1, 1000.0, retain=True), 2011.0) is None  # b resubscribed on a node whose view lags
    assert _stored_version(a) == 2 and b.drops["stale-retained"] == 1
    b.apply(_state(2, 1010.0, retain=True), 2012.0)  # the same report again: stored (it changes nothing)
    b.apply(_state(3, 1020.0, retain=True), 2013.0)  # a newer one the replicas missed live: stored
    assert _stored_version(b) == 3 and b.drops["stale-retained"] == 1


def test_a_live_report_is_stored_by_arrival_whatever_the_device_claims(make_store: MakeStore) -> None:
    ingest = Ingest(make_store())
    ingest.apply(_state(2, 1010.0, retain=False), 2010.0)
    ingest.apply(_state(3, 900.0, retain=False), 2020.0)  # the device's clock went back (a reboot without RTC)
    assert _stored_version(ingest) == 3 and ingest.drops["stale-retained"] == 0


def test_a_stale_retained_birth_is_dropped(make_store: MakeStore) -> None:
    ingest = Ingest(make_store())
    ingest.apply(Message(topics.device("d1", "birth"), Birth("d1", 1010.0, "2.0").to_payload(), False), 2010.0)
    ingest.apply(Message(topics.device("d1", "birth"), Birth("d1", 1000.0, "1.0").to_payload(), True), 2011.0)
    device = ingest.store.device("d1")
    assert device is not None and device.birth is not None and device.birth.agent_version == "2.0"
    assert ingest.drops["stale-retained"] == 1


def test_reconciliation_keeps_the_newer_stored_state(make_store: MakeStore) -> None:
    ingest = Ingest(make_store())
    ingest.apply(_state(2, 1010.0, retain=False), 2010.0)
    now = [50.0]
    clock = StoreClock(lambda: 2100.0, lambda: now[0])
    counts, states = reconcile([Received(_state(1, 1000.0, retain=True), 49.0)], ingest.store, ingest, clock)
    assert not counts and not states and _stored_version(ingest) == 2
    counts, states = reconcile([Received(_state(3, 1020.0, retain=True), 49.5)], ingest.store, ingest, clock)
    assert counts["state"] == 1 and [s.state.active.version for s in states if s.state.active] == [3]
    assert _stored_version(ingest) == 3
