"""``edgectl devices``: what the broker handed over in part is completed from the store, never hides it."""

from __future__ import annotations

from edgectl.controller.records import DeviceRecord
from edgectl.fleet.inventory import _merged


def test_a_device_heard_in_part_keeps_what_the_store_knows() -> None:
    kept = DeviceRecord("cam-1", online=True, last_seen=100.0, telemetry_ts=99.0)
    heard = DeviceRecord("cam-1")  # its birth came, its presence not yet (a clustered broker under load)
    merged = _merged(heard, kept)
    assert (merged.status, merged.last_seen, merged.telemetry_ts) == ("online", 100.0, 99.0)
    newer = _merged(DeviceRecord("cam-1", online=False, last_seen=200.0), kept)  # the broker's own report wins
    assert (newer.status, newer.last_seen) == ("offline", 200.0)
