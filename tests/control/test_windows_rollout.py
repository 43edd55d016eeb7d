"""Maintenance windows and the forced-update deadline in the engine (edgectl/controller/maintenance.py), on a moved clock.

The benchmark (scripts/bench_windows.py) runs the same bench over 2,000 devices in 24 zones.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from edgecore.protocol.envelope import TrustedKeys
from edgecore.protocol.reports import Birth, DeviceEvent
from edgecore.windows import Maintenance
from edgectl.controller.groups import DeviceGroup, GroupKind
from edgectl.controller.maintenance import OPENS_AT, WINDOWS, ZONE, noted_windows, window_data
from edgectl.controller.planner import Plan, PlannedDevice
from edgectl.controller.records import DeviceStatus as D
from edgectl.controller.records import RolloutStatus as S
from edgectl.controller.schedule import iso_utc
from edgectl.fleet import create_group
from edgectl.fleet.rollouts import FleetRequest, deploy_uploaded, rollout_summary
from tests.checkout import REPO, checkout_env
from tests.control.memory_plane import MemoryPlane
from tests.fleet import wait_for
from tests.guards.window_bench import WindowBench

ZONES = ["Etc/GMT-9", "Europe/Lisbon", "America/Chicago"]  # UTC+9, UTC+0 (winter), UTC-6 (winter)
START = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc).timestamp()  # a Tuesday, 12:00 UTC
HOUR = 3600.0


def test_each_device_installs_inside_its_own_window_and_the_wave_waits_for_the_last(tmp_path: Path) -> None:
    bench = WindowBench(tmp_path, 9, ZONES, ["daily 02:00-04:00"], START)
    bench.submit()
    run = bench.run(START + 2 * 86400)
    assert run.status is S.DONE and len(run.installed) == 9
    assert bench.outside(run) == []
    openings = bench.first_openings(START)
    for device, name in bench.zones.items():  # each at its zone's first opening (ticks are 60 s apart)
        assert 0 <= run.installed[device] - openings[str(name)] < 60, (device, name)
    # Tokyo-like +9 opens at 17:00 UTC, Lisbon at 02:00 UTC, Chicago at 08:00 UTC the next day: the rollout spans them.
    assert max(run.installed.values()) - START == openings["America/Chicago"] - START


def test_held_devices_say_when_their_window_opens_and_nothing_is_sent_before(tmp_path: Path) -> None:
    bench = WindowBench(tmp_path, 3, ZONES, ["daily 02:00-04:00"], START)
    rollout_id = bench.submit()
    bench.engine.tick()
    rows = {r.device_id: r for r in bench.store.rollout_devices(rollout_id)}
    assert all(r.status is D.PLANNED for r in rows.values()) and bench.publisher.sent == []
    assert rows["w00000"].data[WINDOWS] == [["daily 02:00-04:00"]] and rows["w00000"].data[ZONE] == "Etc/GMT-9"
    assert rows["w00000"].detail == "waiting for its maintenance window: opens 2026-12-01T17:00:00Z (Wed 02:00 Etc/GMT-9)"
    audit = [a.action for a in bench.store.audit_log(rollout_id=rollout_id)]
    assert "rollout windows" in audit


def test_the_desired_state_carries_the_windows_and_the_deadline(tmp_path: Path) -> None:
    bench = WindowBench(tmp_path, 1, ["Etc/GMT-9"], ["Mon-Fri 02:00-04:00"], START)
    deadline = START + 3 * 86400
    rollout_id = bench.submit(deadline=deadline)
    rollout = bench.store.rollout(rollout_id)
    assert rollout is not None
    row = bench.store.rollout_devices(rollout_id)[0]
    entry = bench.engine.sets.wanted(rollout.spec, row)
    assert entry.maintenance == Maintenance.from_json({"windows": [["Mon-Fri 02:00-04:00"]], "force_at": deadline})


def test_a_deadline_sends_what_the_windows_still_hold(tmp_path: Path) -> None:
    bench = WindowBench(tmp_path, 2, ["Etc/GMT-9"], ["Sat,Sun 00:00-24:00"], START)  # the weekend is days away
    deadline = START + 6 * HOUR
    bench.submit(deadline=deadline)
    run = bench.run(START + 86400)
    assert run.status is S.DONE and set(run.installed.values()) == {deadline}


def test_a_device_without_a_reported_time_zone_waits_and_says_why(tmp_path: Path) -> None:
    bench = WindowBench(tmp_path, 2, ["Etc/GMT-9", None], ["daily 02:00-04:00"], START)
    rollout_id = bench.submit()
    run = bench.run(START + 2 * 86400)
    assert list(run.installed) == ["w00000"] and run.status is S.RUNNING  # the wave still waits for the other one
    held = next(r for r in bench.store.rollout_devices(rollout_id) if r.device_id == "w00001")
    assert held.status is D.PLANNED
    assert held.detail == "waiting: its maintenance windows are in device time, and its agent reports no time zone"


def test_windows_that_never_overlap_hold_the_device_with_that_reason(tmp_path: Path) -> None:
    bench = WindowBench(tmp_path, 1, ["Etc/GMT-9"], ["Mon 02:00-04:00"], START)
    bench.store.add_group(DeviceGroup("other", GroupKind.STATIC, ("w00000",), windows=("Tue 02:00-04:00",)))
    rollout_id = bench.submit()
    bench.run(START + 8 * 86400, step=HOUR)
    row = bench.store.rollout_devices(rollout_id)[0]
    assert row.status is D.PLANNED and "never open together" in row.detail and bench.publisher.sent == []


def test_the_wave_timeout_counts_from_when_the_device_said_its_window_opens(tmp_path: Path) -> None:
    """A device that was sent its desired state but waits for its window (it came back outside it) is not failed by
    a wave timeout counted from the wave's start."""
    bench = WindowBench(tmp_path, 1, ["Etc/GMT-9"], ["daily 00:00-24:00"], START)  # always open to the controller
    rollout_id = bench.submit(wave_timeout_s=600)
    bench.engine.tick()
    opens = START + 10 * HOUR  # the agent says: not before then, by my clock
    bench.engine.reports.on_event("w00000", DeviceEvent("w00000", rollout_id, "window", "waiting", "outside its window",
                                                        START, data={OPENS_AT: opens}))
    bench.now = opens - 60
    bench.engine.tick()
    row = bench.store.rollout_devices(rollout_id)[0]
    assert row.status is D.SENT and row.data[OPENS_AT] == opens
    bench.now = opens + 601
    bench.engine.tick()
    assert bench.store.rollout_devices(rollout_id)[0].status is D.FAILED


def test_a_window_group_changed_after_the_rollout_was_recorded_does_not_move_it(tmp_path: Path) -> None:
    bench = WindowBench(tmp_path, 1, ["Etc/GMT-9"], ["daily 02:00-04:00"], START)
    rollout_id = bench.submit()
    group = bench.store.group("fleet")
    assert group is not None
    bench.store.save_group(DeviceGroup(group.name, group.kind, group.members, windows=()))
    bench.engine.tick()
    assert bench.store.rollout_devices(rollout_id)[0].status is D.PLANNED  # still held by the windows it was planned with


def test_a_group_window_and_a_deadline_through_the_operators_path(memory_plane: MemoryPlane) -> None:
    """The API's path (deploy_uploaded): a device of a window group waits while one outside the group installs; the
    deadline then sends it. Light agents report UTC (edgectl.sim)."""
    plane = memory_plane
    plane.agents("cam-1", "cam-2")
    store = plane.store
    opens = datetime.now(timezone.utc) + timedelta(hours=6)
    create_group(store, "plant", "static", ["cam-1"], actor="ana",
                 windows=[f"daily {opens:%H:%M}-{opens + timedelta(hours=1):%H:%M}"])
    package = plane.package("det", 1)
    deadline = store.now() + 5
    request = FleetRequest([package.path], "all", waves="100%", bake="0s", deadline=iso_utc(deadline + 1))
    trusted = TrustedKeys([plane.shelf.key.public_key()])
    dry, nothing = deploy_uploaded(replace(request, dry_run=True), store, trusted, 30.0, "ana")
    notes = {d["device_id"]: d["note"] for w in dry.to_dict()["waves"] for d in w["devices"]}
    assert nothing is None and notes["cam-2"] == "" and notes["cam-1"].startswith("waiting for its maintenance window: opens ")
    assert notes["cam-1"].endswith(" UTC)") and store.rollouts() == []  # a dry run says when, and records nothing
    _plan, rollout_id = deploy_uploaded(request, store, trusted, 30.0, "ana")
    assert rollout_id is not None
    wait_for(lambda: plane.rows(rollout_id)["cam-2"].status is D.OK, 20, "cam-2, in no window group, to install")
    held = plane.rows(rollout_id)["cam-1"]
    assert held.status is D.PLANNED and "waiting for its maintenance window" in held.detail
    devices = {d["device_id"]: d for d in rollout_summary(store, rollout_id)["devices"]}
    assert devices["cam-1"]["windows"] == [[f"daily {opens:%H:%M}-{opens + timedelta(hours=1):%H:%M}"]]
    assert devices["cam-1"]["timezone"] == "UTC" and devices["cam-2"]["windows"] is None
    assert plane.ended(rollout_id).status is S.DONE
    assert (plane.rows(rollout_id)["cam-1"].installed_at or 0) >= deadline


def test_the_deadline_sends_a_device_whose_time_zone_is_unknown(tmp_path: Path) -> None:
    bench = WindowBench(tmp_path, 1, [None], ["daily 02:00-04:00"], START)
    deadline = START + 2 * HOUR
    rollout_id = bench.submit(deadline=deadline)
    bench.engine.tick()
    assert bench.store.rollout_devices(rollout_id)[0].detail.endswith("; the deadline 2026-12-01T14:00:00Z sends it")
    run = bench.run(START + 86400)
    assert run.status is S.DONE and run.installed == {"w00000": deadline}


def test_the_window_benchmark_runs_and_passes_on_a_small_fleet() -> None:
    """scripts/bench_windows.py as docs/benchmarks.md runs it, on 48 devices (2 per zone), without touching the docs."""
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_windows.py"), "--devices", "48", "--no-docs"],
                          capture_output=True, text=True, timeout=300, env=checkout_env())
    assert done.returncode == 0, done.stdout + done.stderr
    assert "48 devices in 24 time zones" in done.stdout and "— PASS" in done.stdout
    assert "| installed outside their window (device time) | 0 |" in done.stdout


def test_a_devices_own_windows_count_beside_its_groups_configuration_before_agent_yaml(tmp_path: Path) -> None:
    """window_data: a group's windows, plus the device's own: the configuration the operators set, else agent.yaml's
    as its birth reported them."""
    bench = WindowBench(tmp_path, 3, ZONES, ["daily 02:00-04:00"], START)
    bench.store.upsert_device("w00001", birth=Birth("w00001", START, timezone="Europe/Lisbon",
                                                    maintenance_windows=("Sat 01:00-05:00",)))
    records = bench.store.devices()
    found = window_data(bench.store.groups(), records, {"w00002": ("Sun 03:00-04:00",)})
    assert found["w00000"] == {WINDOWS: [["daily 02:00-04:00"]], ZONE: "Etc/GMT-9"}
    assert found["w00001"] == {WINDOWS: [["daily 02:00-04:00"], ["Sat 01:00-05:00"]], ZONE: "Europe/Lisbon"}
    assert found["w00002"][WINDOWS] == [["daily 02:00-04:00"], ["Sun 03:00-04:00"]]
    alone = window_data([], records, {"w00001": ()})  # configured to none: agent.yaml's no longer count
    assert alone == {}


def test_a_dry_run_notes_each_devices_window_beside_what_it_already_said() -> None:
    plan = Plan([PlannedDevice("a", 1, None, None), PlannedDevice("b", 1, None, None, "flag"),
                 PlannedDevice("c", 1, None, None)], {}, 0.0, waves=1)
    windows: dict[str, dict[str, Any]] = {"a": {WINDOWS: [["daily 00:00-24:00"]], ZONE: "UTC"},
                                          "b": {WINDOWS: [["Mon 01:00-02:00"]], ZONE: None}}
    noted = noted_windows(plan, windows, None, START)
    assert [d.reason for d in noted.devices] == [
        "inside its maintenance windows now",
        "flag; waiting: its maintenance windows are in device time, and its agent reports no time zone", ""]
