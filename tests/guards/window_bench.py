"""A maintenance-window rollout driven in process on a simulated clock (the engine's clock seam).

Devices are online, each with a birth naming its time zone; a static group holds them with the
windows asked for. The rollout is recorded through the operator's path (plan, :func:`window_data`,
submit) and driven by the real engine; a device reports its install done at the tick its desired
state is sent, which is when it would install (the agent holds it for its window the same way:
agent/deploy/window.py). Used by tests/control/test_windows_rollout.py and scripts/bench_windows.py.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from edgecore.protocol.reports import Birth, DeviceEvent
from edgecore.windows import Windows, zone
from edgectl.controller.engine import Engine
from edgectl.controller.groups import DeviceGroup, GroupKind
from edgectl.controller.maintenance import window_data
from edgectl.controller.planner import plan_rollout
from edgectl.controller.records import DeviceStatus, RolloutStatus
from edgectl.controller.store import SqliteStore
from edgectl.controller.submit import RolloutOptions, submit_rollout
from tests.guards.rollout_bench import Recorder, signed_package

__all__ = ["WindowBench", "WindowRun"]


@dataclass
class WindowRun:
    """What a run saw: when each device installed, and how many engine ticks it took."""

    installed: dict[str, float] = field(default_factory=dict)  # device id -> simulated time of its install
    ticks: int = 0
    tick_s: float = 0.0  # wall-clock seconds spent in the engine's ticks
    status: RolloutStatus = RolloutStatus.RUNNING


class WindowBench:
    """``zones[i % len(zones)]`` is device ``w{i}``'s time zone (None: its agent reports none)."""

    def __init__(self, folder: Path, devices: int, zones: Sequence[str | None], windows: Sequence[str],
                 start: float) -> None:
        self.now = start
        self.folder = folder
        self.store = SqliteStore(folder / "store.db")
        self.publisher = Recorder()
        self.engine = Engine(self.store, self.publisher, lambda _target, _backend: None, clock=lambda: self.now)
        self.zones = {f"w{i:05d}": zones[i % len(zones)] for i in range(devices)}
        self.windows = Windows.parse(windows)
        with self.store.batch():
            for device, name in self.zones.items():
                self.store.upsert_device(device, online=1, last_seen=self.now,
                                         birth=Birth(device, self.now, "0.1", "any", timezone=name))
        self.store.add_group(DeviceGroup("fleet", GroupKind.STATIC, tuple(self.zones), windows=tuple(windows)))
        self.rollout_id = ""

    def submit(self, waves: str = "100%", deadline: float | None = None, wave_timeout_s: float = 600.0,
               gates: Sequence[str] = ()) -> str:
        records = self.store.devices()
        rows = [{"device_id": r.id, "target": "any", "status": "online"} for r in records]
        plan = plan_rollout(rows, [signed_package(self.folder)], waves, 0.0)
        options = RolloutOptions("group:fleet", 0.05, 0.0, list(gates), wave_timeout_s=wave_timeout_s, deadline=deadline,
                                 windows=window_data(self.store.groups(), records))
        self.rollout_id = submit_rollout(self.store, plan, options)
        return self.rollout_id

    def run(self, until: float, step: float = 60.0, heartbeat_s: float = 0.0) -> WindowRun:
        """Tick every ``step`` simulated seconds until the rollout ends or ``until``; sent devices install at once.
        Devices are heard from every ``heartbeat_s`` (0: every tick; the silence gate must allow the gap)."""
        seen = WindowRun()
        heard = float("-inf")
        while self.now <= until:
            began = time.perf_counter()
            self.engine.tick()
            seen.tick_s += time.perf_counter() - began
            seen.ticks += 1
            beat = self.now - heard >= heartbeat_s
            heard = self.now if beat else heard
            with self.store.batch():
                for row in self.store.rollout_devices(self.rollout_id):
                    if beat:
                        self.store.upsert_device(row.device_id, last_seen=self.now)  # heard from: no silence
                    if row.status == DeviceStatus.SENT:
                        seen.installed[row.device_id] = self.now
                        self.engine.reports.on_event(row.device_id, DeviceEvent(row.device_id, self.rollout_id, "done",
                                                                                "ok", "", self.now))
            rollout = self.store.rollout(self.rollout_id)
            assert rollout is not None
            seen.status = rollout.status
            if rollout.status is RolloutStatus.DONE:
                break
            self.now += step
        return seen

    def outside(self, run: WindowRun) -> list[str]:
        """The devices that installed outside their window, in their own time zone."""
        return [d for d, at in run.installed.items()
                if self.zones[d] is None or not self.windows.is_open(at, zone(str(self.zones[d])))]

    def first_openings(self, after: float) -> dict[str, float]:
        """Each zone's first window opening at or after ``after`` (zones without a name left out)."""
        return {name: opens for name in {z for z in self.zones.values() if z}
                if (opens := self.windows.next_open(after, zone(name))) is not None}
