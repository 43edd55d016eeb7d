"""Rollout pacing (issue 15.5): a wave sends at most N desired states a minute, on the engine's clock seam."""

from __future__ import annotations

from pathlib import Path

from edgecore.protocol.reports import DeviceEvent
from edgectl.controller.engine import Engine
from edgectl.controller.records import DeviceStatus as D
from edgectl.controller.records import PackageRef, Phase, RolloutDevice, RolloutRow, RolloutSpec
from edgectl.controller.records import RolloutStatus as S
from edgectl.controller.store import SqliteStore
from tests.guards.rollout_bench import Recorder


class PacedBench:
    """One wave of ``devices`` online devices at ``rate`` a minute; the clock moves by hand."""

    def __init__(self, path: Path, devices: int, rate: int) -> None:
        self.now = 1000.0
        self.store = SqliteStore(path / "store.db")
        self.publisher = Recorder()
        package = PackageRef("v1", "a1", "clf", 2, "any", "clf v2", str(path / "clf.edgepkg"), 10)
        spec = RolloutSpec("all", (package,), 1, 0.5, 0.0, ("silence <= 60s",), 60.0, wave_timeout_s=30, max_per_minute=rate)
        ids = [f"d{i:02d}" for i in range(devices)]
        for device in ids:
            self.store.upsert_device(device, online=1, last_seen=self.now)
        self.store.create_rollout(RolloutRow("r1", self.now, S.RUNNING, spec, wave=1, phase=Phase.START),
                                  [RolloutDevice("r1", d, 1, "v1", D.PLANNED) for d in ids])

    def engine(self) -> Engine:
        return Engine(self.store, self.publisher, lambda _t, _b: None, clock=lambda: self.now)

    def sent(self) -> int:
        return sum(kind == "desired" for kind, _ in self.publisher.sent)

    def run(self, engine: Engine, seconds: float, step: float = 0.5) -> None:
        end = self.now + seconds
        while self.now < end:
            engine.tick()
            for row in self.store.rollout_devices("r1"):
                self.store.upsert_device(row.device_id, last_seen=self.now)  # heard from: no silence
                if row.status == D.SENT:  # each device installs at once
                    engine.reports.on_event(row.device_id, DeviceEvent(row.device_id, "r1", "done", "ok", "", self.now))
            self.now += step


def test_a_paced_wave_sends_n_a_minute_evenly_and_completes(tmp_path: Path) -> None:
    bench = PacedBench(tmp_path, devices=25, rate=10)
    engine = bench.engine()
    bench.run(engine, 0.4)
    assert bench.sent() == 1  # the first at once
    bench.run(engine, 29.0)
    assert bench.sent() == 5  # one every 6 s, not ten at once
    bench.run(engine, 30.0)
    assert bench.sent() == 10
    bench.run(engine, 60)
    assert bench.sent() == 20
    row = bench.store.rollout("r1")
    assert row is not None and row.phase == Phase.INSTALLING  # not installed while devices wait to be sent
    bench.run(engine, 40)
    assert bench.sent() == 25 and (bench.store.rollout("r1") or row).status is S.DONE


def test_pace_holds_across_an_engine_restart(tmp_path: Path) -> None:
    """A new engine (a restarted or new leader controller) counts what the last minute already sent."""
    bench = PacedBench(tmp_path, devices=30, rate=10)
    bench.run(bench.engine(), 55)
    assert bench.sent() == 10
    bench.run(bench.engine(), 4.5)  # a fresh engine at t = 55 s: the minute's budget is spent
    assert bench.sent() == 10
    assert all(sum(1 for r in bench.store.rollout_devices("r1") if t <= float(r.data.get("sent_at", -1)) < t + 60) <= 10
               for t in range(1000, 1060))


def test_unpaced_waves_send_everything_at_once(tmp_path: Path) -> None:
    bench = PacedBench(tmp_path, devices=25, rate=0)
    bench.engine().tick()
    assert bench.sent() == 25
