"""Telemetry history stays bounded: newest rows per device, an age limit, and pruning as rows arrive."""

from __future__ import annotations

import time

from edgectl.controller.records import DeviceEventRow
from edgectl.controller.store import Retention
from tests.store.conftest import MakeStore


def fill(store: object, devices: int, rows: int, start: float) -> None:
    for d in range(devices):
        for i in range(rows):
            store.add_latency(f"d{d}", "tiny", 1, float(i), "telemetry", start + i)  # type: ignore[attr-defined]
            store.add_event(f"d{d}", start + i, "r-1", "done", "ok", "", {"i": i})  # type: ignore[attr-defined]


def test_prune_keeps_the_newest_rows_per_device(make_store: MakeStore) -> None:
    store = make_store(Retention(latency_rows=5, events=3, max_age_s=0, every_s=3600))
    now = time.time()
    fill(store, 2, 12, now)
    for e in store.unclaimed_events():
        store.claim_event(e)
    assert len(store.latency("d0")) == 12  # nothing pruned before it is due
    store.prune()
    for device in ("d0", "d1"):
        assert [p.p95_ms for p in store.latency(device)] == [7.0, 8.0, 9.0, 10.0, 11.0]
        assert [e.data["i"] for e in store.events(device, limit=100)] == [9, 10, 11]


def test_events_no_leader_applied_yet_are_kept(make_store: MakeStore) -> None:
    store = make_store(Retention(latency_rows=0, events=2, max_age_s=60, every_s=3600))
    now = time.time()
    fill(store, 1, 5, now - 1000)  # all older than the age limit, none claimed
    store.claim_event(DeviceEventRow("d0", now - 1000, "r-1", "done", "ok", "", {}))
    store.prune(now)
    assert store.latency("d0") == []  # too old
    assert [e.data["i"] for e in store.events("d0", limit=100)] == [1, 2, 3, 4]  # unclaimed stay until applied


def test_age_limit(make_store: MakeStore) -> None:
    store = make_store(Retention(latency_rows=0, events=0, max_age_s=100, every_s=3600))
    now = time.time()
    store.add_latency("d0", "tiny", 1, 1.0, "telemetry", now - 500)
    store.add_latency("d0", "tiny", 1, 2.0, "telemetry", now - 50)
    assert store.prune(now) == 1
    assert [p.p95_ms for p in store.latency("d0")] == [2.0]


def test_history_is_pruned_as_rows_arrive(make_store: MakeStore) -> None:
    """With ``every_s`` = 0 each write prunes the devices written: the table never holds more than the limit."""
    store = make_store(Retention(latency_rows=4, events=4, max_age_s=0, every_s=0))
    now = time.time()
    for i in range(20):
        store.add_latency("d0", "tiny", 1, float(i), "telemetry", now + i)
        assert len(store.latency("d0", limit=1000)) <= 4
    assert [p.p95_ms for p in store.latency("d0")] == [16.0, 17.0, 18.0, 19.0]
