"""A retained copy older than a report stored moments ago never replaces it (on a resubscription or in reconciliation).

A NATS node's view of the retained messages lags the stream the other nodes write to: a controller
that subscribes there (again, or through the reconciler's short connection) can be handed a device's
previous state seconds after the new one arrived live. Ordered by arrival, that copy put the old
model back in the store until the device's next change (the HA stack's "v2 everywhere" check saw v1
for 30 s). Such a copy is dropped when it claims an earlier time, on the device's own clock, than the
birth or state this controller stored less than a minute before; anything else goes by arrival, so a
device whose clock went back (a reboot without RTC) is still recovered.
"""

from __future__ import annotations

from edgecore.protocol import topics
from edgecore.protocol.reports import Birth, DeviceState, RunningModel
from edgecore.transport import Message
from edgectl.controller.clock import StoreClock
from edgectl.controller.inbox import Received
from edgectl.controller.ingest import STALE_WITHIN_S, Ingest
from edgectl.controller.reconcile import reconcile
from tests.store.conftest import MakeStore


def _state(version: int, claimed: float, retain: bool, seq: int | None = None) -> Message:
    state = DeviceState.of_set("d1", claimed, (RunningModel("det", version, f"art-{version}"),), None,
                               version if seq is None else seq, None)
    return Message(topics.device("d1", "state"), state.to_payload(), retain)


def _birth(agent_version: str, claimed: float, retain: bool) -> Message:
    return Message(topics.device("d1", "birth"), Birth("d1", claimed, agent_version).to_payload(), retain)


def _stored_version(ingest: Ingest) -> int | None:
    device = ingest.store.device("d1")
    assert device is not None and device.active is not None
    return device.active.version


def test_a_stale_retained_state_after_the_live_one_is_dropped_and_counted(make_store: MakeStore) -> None:
    a, b = Ingest(make_store()), Ingest(make_store(cache="cache-b"))
    for ingest, lag in ((a, 0.0), (b, 0.2)):  # on NATS every replica receives every report
        ingest.apply(_state(1, 2000.0, retain=False), 2000.0 + lag)
        ingest.apply(_state(2, 2010.0, retain=False), 2010.0 + lag)  # the new model, live
    assert b.apply(_state(1, 2000.0, retain=True), 2011.0) is None  # b resubscribed on a node whose view lags
    assert _stored_version(a) == 2 and b.drops["stale-retained"] == 1
    b.apply(_state(2, 2010.0, retain=True), 2012.0)  # the same report again: stored (it changes nothing)
    b.apply(_state(3, 2012.5, retain=True), 2013.0)  # a newer one the replicas missed live: stored
    assert _stored_version(b) == 3 and b.drops["stale-retained"] == 1


def test_only_a_report_stored_moments_ago_makes_a_copy_stale(make_store: MakeStore) -> None:
    """A device that rebooted with its clock behind: its retained reports claim earlier times, and are what it runs."""
    ingest = Ingest(make_store())
    ingest.apply(_state(2, 2010.0, retain=False), 2010.0)
    ingest.apply(_state(3, 2005.0, retain=True), 2010.0 + STALE_WITHIN_S + 1)  # the controller was away a while
    assert _stored_version(ingest) == 3
    ingest.apply(_state(4, 2004.0, retain=True, seq=9), 2080.0)  # moments later, but a later accepted command
    assert _stored_version(ingest) == 4 and ingest.drops["stale-retained"] == 0


def test_a_live_report_is_stored_by_arrival_whatever_the_device_claims(make_store: MakeStore) -> None:
    ingest = Ingest(make_store())
    ingest.apply(_state(2, 2010.0, retain=False), 2010.0)
    ingest.apply(_state(3, 2000.0, retain=False), 2020.0)  # the device's clock went back
    assert _stored_version(ingest) == 3 and ingest.drops["stale-retained"] == 0


def test_a_device_whose_clock_is_flagged_off_goes_by_arrival(make_store: MakeStore) -> None:
    ingest = Ingest(make_store())
    ingest.apply(_state(2, 9000.0, retain=False), 2010.0)  # claims a time hours ahead of the controller's: flagged
    assert "d1" in ingest.clock_off
    ingest.apply(_state(3, 2011.0, retain=True), 2012.0)  # its clock was put right
    assert _stored_version(ingest) == 3 and ingest.drops["stale-retained"] == 0


def test_a_stale_retained_birth_is_dropped(make_store: MakeStore) -> None:
    ingest = Ingest(make_store())
    ingest.apply(_birth("2.0", 2010.0, retain=False), 2010.0)
    ingest.apply(_birth("1.0", 2000.0, retain=True), 2011.0)
    device = ingest.store.device("d1")
    assert device is not None and device.birth is not None and device.birth.agent_version == "2.0"
    assert ingest.drops["stale-retained"] == 1


def test_reconciliation_keeps_the_newer_state_stored_moments_ago(make_store: MakeStore) -> None:
    ingest = Ingest(make_store())
    ingest.apply(_state(2, 2010.0, retain=False), 2010.0)
    clock = StoreClock(lambda: 2020.0, lambda: 50.0)  # the store's clock reads 2020 at monotonic 50
    counts, states = reconcile([Received(_state(1, 2000.0, retain=True), 49.0)], ingest.store, ingest, clock)
    assert not counts and not states and _stored_version(ingest) == 2
    counts, states = reconcile([Received(_state(3, 2019.0, retain=True), 49.5)], ingest.store, ingest, clock)
    assert counts["state"] == 1 and [s.state.active.version for s in states if s.state.active] == [3]
    assert _stored_version(ingest) == 3
