"""Maintenance windows at fleet scale: a rollout over devices in 24 time zones, on a simulated clock.

./scripts/bench windows [--devices 2000] [--no-docs]

Devices are spread evenly over 24 real IANA zones, one per UTC offset from -11 to +12 in December
(several with daylight-saving rules, read from their names), all in one group whose window is
``daily 02:00-04:00`` device time. One rollout (one wave, every device) is recorded through the
operator's path and driven by the real engine on a clock moved 60 s a tick (tests/guards/window_bench.py);
a device installs at the tick its desired state is sent. Checked: every device installs inside its
window in its own zone and none outside; each zone's devices install at that zone's first opening;
and the rollout lasts exactly as long as the windows take to open around the world (its duration
equals the span from the first zone's opening to the last one's, to the tick). Also measured: the
engine's wall time per tick over the whole fleet.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from benchdoc import machine, write_section  # noqa: E402

from edgectl.controller.records import RolloutStatus  # noqa: E402
from edgectl.controller.schedule import iso_utc  # noqa: E402
from tests.guards.window_bench import WindowBench  # noqa: E402

ZONES = ["Pacific/Pago_Pago", "Pacific/Honolulu", "America/Anchorage", "America/Los_Angeles", "America/Denver",
         "America/Chicago", "America/New_York", "America/Halifax", "America/Sao_Paulo", "Atlantic/South_Georgia",
         "Atlantic/Azores", "Europe/Lisbon", "Europe/Berlin", "Europe/Athens", "Europe/Moscow", "Asia/Dubai",
         "Asia/Karachi", "Asia/Dhaka", "Asia/Bangkok", "Asia/Shanghai", "Asia/Tokyo", "Australia/Brisbane",
         "Pacific/Noumea", "Asia/Kamchatka"]
WINDOW = "daily 02:00-04:00"
START = datetime(2026, 12, 1, 0, 0, tzinfo=timezone.utc).timestamp()
STEP_S = 60.0
COMMAND = "./scripts/bench windows"


@dataclass(frozen=True)
class Result:
    devices: int
    status: RolloutStatus
    installed: int
    outside: int  # installed outside their window, in their own zone
    late: int  # installed later than their zone's first opening (beyond one tick)
    span_s: float  # the first zone's opening to the last zone's
    first: float | None  # the first install (simulated time)
    last: float | None
    per_zone: tuple[int, int]  # fewest and most devices a zone has
    ticks: int
    tick_ms: float  # wall time per engine tick, mean
    wall_s: float

    @property
    def duration_s(self) -> float:
        return (self.last - self.first) if self.first is not None and self.last is not None else 0.0

    @property
    def passed(self) -> bool:
        return (self.status is RolloutStatus.DONE and self.installed == self.devices and not self.outside
                and not self.late and abs(self.duration_s - self.span_s) < STEP_S)


def run(devices: int, work: Path) -> Result:
    bench = WindowBench(work, devices, ZONES, [WINDOW], START)
    bench.submit(gates=["silence <= 2h"])  # devices are heard from hourly here; the default 60 s gate needs every tick
    began = time.perf_counter()
    seen = bench.run(START + 3 * 86400, STEP_S, heartbeat_s=3600.0)
    wall_s = time.perf_counter() - began
    openings = bench.first_openings(START)
    late = [d for d, at in seen.installed.items() if not 0 <= at - openings[str(bench.zones[d])] < STEP_S]
    installs = sorted(seen.installed.values())
    per_zone = [sum(1 for zone in bench.zones.values() if zone == z) for z in ZONES]
    return Result(devices, seen.status, len(seen.installed), len(bench.outside(seen)), len(late),
                  max(openings.values()) - min(openings.values()), installs[0] if installs else None,
                  installs[-1] if installs else None, (min(per_zone), max(per_zone)), seen.ticks,
                  1000 * seen.tick_s / max(seen.ticks, 1), wall_s)


def report(r: Result) -> str:
    verdict = "PASS" if r.passed else "FAIL"
    when = f"{iso_utc(r.first)} to {iso_utc(r.last)}" if r.first is not None and r.last is not None else "none"
    return "\n".join([
        f"### {r.devices} devices in {len(ZONES)} time zones, window `{WINDOW}` device time — {verdict}",
        "",
        "| Figure | Measured |",
        "|---|---|",
        f"| rollout status | {r.status.value} |",
        f"| devices installed | {r.installed} of {r.devices} ({r.per_zone[0]}-{r.per_zone[1]} per zone) |",
        f"| installed outside their window (device time) | {r.outside} |",
        f"| installed later than their zone's first opening (+{STEP_S:.0f} s tick) | {r.late} |",
        f"| windows' span (first zone's opening to the last one's) | {r.span_s / 3600:.2f} h |",
        f"| rollout duration (first install to last) | {r.duration_s / 3600:.2f} h ({when}) |",
        f"| engine ticks (60 s of simulated time each) | {r.ticks}, {r.tick_ms:.1f} ms each on average "
        f"({r.wall_s:.0f} s wall in all) |",
        "",
        f"Machine: {machine()}. Rerun: `{COMMAND}`.",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=2000, help="simulated devices (default 2000)")
    parser.add_argument("--no-docs", action="store_true", help="do not write the figures into docs/benchmarks.md")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="edgectl-windows-") as tmp:
        result = run(args.devices, Path(tmp))
    text = report(result)
    print(text)
    if not args.no_docs:
        print(f"written to {write_section('maintenance windows', COMMAND, text)}")
    if not result.passed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
