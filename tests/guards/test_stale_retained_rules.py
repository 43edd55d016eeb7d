"""The edges of the stale-retained rule (edgectl/controller/ingest.py, Ingest.stale), on a SQLite store.

tests/store/test_stale_retained.py tells the story on both stores; these pin each condition: the
window's edge, an equal accepted sequence, a report that claims no time, a device's first report,
a device whose clock is flagged off, and births beside states.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from edgecore.protocol import topics
from edgecore.protocol.reports import Birth, DeviceState, RunningModel
from edgecore.protocol.telemetry import DeviceMetrics, Telemetry
from edgecore.transport import Message
from edgectl.controller.ingest import STALE_WITHIN_S, Ingest
from edgectl.controller.store import SqliteStore


@pytest.fixture
def ingest(tmp_path: Path) -> Ingest:
    return Ingest(SqliteStore(tmp_path / "controller.db"))


def _state(version: int, claimed: float | None, seq: int) -> DeviceState:
    return DeviceState.of_set("d1", claimed, (RunningModel("det", version, f"art-{version}"),), None, seq, None)


def _message(report: DeviceState | Birth, retain: bool) -> Message:
    return Message(topics.device("d1", type(report).LEAF), report.to_payload(), retain)


def test_a_copy_is_stale_up_to_the_window_s_edge_and_not_past_it(ingest: Ingest) -> None:
    ingest.apply(_message(_state(2, 2000.0, seq=5), retain=False), 2000.0)
    older = _state(1, 1999.0, seq=4)
    assert ingest.stale(older, 2000.0 + STALE_WITHIN_S)
    assert not ingest.stale(older, 2000.0 + STALE_WITHIN_S + 0.01)


def test_an_equal_accepted_sequence_and_an_earlier_time_is_stale_a_later_sequence_is_not(ingest: Ingest) -> None:
    ingest.apply(_message(_state(2, 2000.0, seq=5), retain=False), 2000.0)
    assert ingest.stale(_state(1, 1999.0, seq=5), 2001.0)
    assert not ingest.stale(_state(3, 1999.0, seq=6), 2001.0)
    assert not ingest.stale(_state(2, 2000.0, seq=5), 2001.0)  # the same report again


def test_a_birth_is_judged_by_its_time_alone(ingest: Ingest) -> None:
    ingest.apply(_message(Birth("d1", 2000.0, "2.0"), retain=False), 2000.0)
    assert ingest.stale(Birth("d1", 1999.0, "1.0"), 2001.0)
    assert not ingest.stale(_state(1, 1999.0, seq=0), 2001.0)  # no state stored: a birth does not judge states


def test_no_claimed_time_a_first_report_and_other_reports_are_never_stale(ingest: Ingest) -> None:
    assert not ingest.stale(_state(1, 1999.0, seq=0), 2001.0)  # nothing stored yet for the device
    ingest.apply(_message(_state(2, 2000.0, seq=5), retain=False), 2000.0)
    ingest.apply(_message(Birth("d1", 2000.0, "2.0"), retain=False), 2000.0)
    assert not ingest.stale(_state(1, None, seq=5), 2001.0)
    assert not ingest.stale(Birth("d1", None, "1.0"), 2001.0)
    assert not ingest.stale(Telemetry("d1", 1999.0, DeviceMetrics(1.0)), 2001.0)


def test_a_device_whose_clock_is_flagged_off_is_never_judged_by_it(ingest: Ingest) -> None:
    ingest.apply(_message(_state(2, 9000.0, seq=5), retain=False), 2000.0)  # hours ahead: flagged
    assert "d1" in ingest.clock_off
    assert not ingest.stale(_state(3, 2001.0, seq=5), 2001.0)


def test_a_stale_retained_copy_is_dropped_and_a_live_one_is_stored(ingest: Ingest) -> None:
    ingest.apply(_message(_state(2, 2000.0, seq=5), retain=False), 2000.0)
    assert ingest.apply(_message(_state(1, 1999.0, seq=5), retain=True), 2001.0) is None
    assert ingest.drops["stale-retained"] == 1
    assert ingest.apply(_message(_state(1, 1999.0, seq=5), retain=False), 2002.0) is not None  # live: by arrival
    device = ingest.store.device("d1")
    assert device is not None and device.active is not None and device.active.version == 1
