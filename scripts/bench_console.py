"""Console benchmark, part 1: the REST API's device list over 10,000 device records.

A real ``edgectl api serve`` process on a SQLite store holding ``--devices`` simulated device rows
(birth, state and telemetry as light agents report them); a client asks for pages of 100 with a
filter (target and presence, a tag, a text search, model and version, a selector), at offsets
across the result, one request at a time. Goal (issue 16): p95 <= 200 ms on 2 cores. Part 2
(scripts/console_render.py): the fleet and devices pages' first full render in headless Chromium
on the same server (skipped with a note when chromium is missing, or with --no-browser).

    ./scripts/bench console [--devices 10000] [--requests 300] [--loads 5] [--no-browser] [--doc]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from benchdoc import machine, write_section  # noqa: E402
from console_render import missing, render_lines, render_times  # noqa: E402

from edgecore.protocol.reports import (  # noqa: E402
    Birth,
    DeviceMetrics,
    DeviceState,
    LatencyFigures,
    ModelTelemetry,
    RunningModel,
    Telemetry,
)
from edgectl.api.accounts import Accounts  # noqa: E402
from edgectl.controller.accounts import Role  # noqa: E402
from edgectl.controller.store import SqliteStore  # noqa: E402
from tests.brokers import free_port  # noqa: E402
from tests.checkout import checkout_env  # noqa: E402

GOAL_MS = 200.0
TARGETS = ("cpu-x86", "jetson-orin", "nnapi", "qnn-htp", "cpu-arm")
FILTERS = ("target={target}&status=online", "tag=group%3Dg{group}", "q=dev-0{digit}", "model=det&version={version}",
           "selector=site%3Dlobby,target%3D{target}")


def fill(store: SqliteStore, count: int) -> None:
    now = time.time()
    with store.batch():
        for i in range(count):
            device_id, target, version = f"dev-{i:05d}", TARGETS[i % len(TARGETS)], 1 + i % 3
            birth = Birth(device_id, now, "0.1.0", target, {"group": f"g{i % 20}", "site": "lobby" if i % 2 else "dock"}, None,
                          {"simulated": True, "profile": target, "cpu_cores": 4, "memory_mb": 4096}, {"onnxruntime": "1.18"})
            active = RunningModel("det", version, "a" * 64, "onnxruntime/CPUExecutionProvider")
            served = ModelTelemetry(str(version), "CPUExecutionProvider", 1000, 0, LatencyFigures(p50=3.1, p95=5.2))
            telemetry = Telemetry(device_id, now - 0.05, DeviceMetrics(cpu_percent=12.5), {"det": served})
            store.upsert_device(device_id, online=int(i % 4 != 0), last_seen=now, birth=birth,
                                state=DeviceState(device_id, now, active, None, 3), telemetry=telemetry, telemetry_ts=now)


def query(rng: random.Random) -> str:
    template = rng.choice(FILTERS)
    text = template.format(target=rng.choice(TARGETS), group=rng.randrange(20), digit=rng.randrange(10),
                           version=rng.randrange(1, 4))
    return f"/api/v1/devices?{text}&limit=100&offset={rng.choice((0, 100, 500, 1000))}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=10_000)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--loads", type=int, default=5, help="Fresh loads of each console page in Chromium.")
    parser.add_argument("--no-browser", action="store_true", help="Skip the console's render times in Chromium.")
    parser.add_argument("--doc", action="store_true", help="Write the figures to docs/benchmarks.md (section 'console').")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-console-") as tmp:
        root = Path(tmp)
        store = SqliteStore(root / "controller.db")
        started = time.perf_counter()
        fill(store, args.devices)
        filled_s = time.perf_counter() - started
        accounts = Accounts(store)
        accounts.add_user("bench", Role.VIEWER, "bench")
        _, token = accounts.create_token("bench", "bench", None, "bench")
        (root / "edgectl.yaml").write_text(json.dumps({"controller": {"store": str(root / "controller.db")}}))
        port = free_port()
        server = subprocess.Popen([sys.executable, "-m", "edgectl.cli.main", "api", "serve", "--http", f"127.0.0.1:{port}"],
                                  cwd=root, env=checkout_env(EDGECTL_HOME=str(root / "home")), stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE)
        renders: list[str] = []
        try:
            times, totals = run(f"http://127.0.0.1:{port}", token, args.requests)
            if not args.no_browser:
                reason = missing()
                renders = [f"- console render times skipped: {reason}"] if reason else render_lines(
                    render_times(f"http://127.0.0.1:{port}", token, args.loads), args.devices)
        finally:
            server.terminate()
            server.wait(20)
    report(args, filled_s, times, totals, renders)
    return 0 if statistics.quantiles(times, n=20)[-1] <= GOAL_MS else 5


def run(url: str, token: str, requests: int) -> tuple[list[float], list[int]]:
    headers = {"Authorization": f"Bearer {token}"}
    deadline = time.monotonic() + 60
    while True:  # until the server answers
        try:
            urllib.request.urlopen(f"{url}/api/v1/health", timeout=2).read()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    rng, times, totals = random.Random(16), [], []
    for i in range(requests + 10):
        request = urllib.request.Request(url + query(rng), headers=headers)
        start = time.perf_counter()
        with urllib.request.urlopen(request, timeout=30) as answer:
            body = json.loads(answer.read())
        elapsed = (time.perf_counter() - start) * 1000
        if i >= 10:  # the first requests warm the server's connection and caches
            times.append(elapsed)
            totals.append(body["total"])
    return times, totals


def report(args: argparse.Namespace, filled_s: float, times: list[float], totals: list[int], renders: list[str]) -> None:
    p50, p95 = statistics.median(times), statistics.quantiles(times, n=20)[-1]
    verdict = "met" if p95 <= GOAL_MS else "NOT met"
    command = f"./scripts/bench console --devices {args.devices} --requests {args.requests} --loads {args.loads}"
    lines = [
        f"- machine: {machine()}",
        f"- store: {args.devices} device records (filled in {filled_s:.1f} s), SQLite, `edgectl api serve` in its own process",
        f"- {len(times)} requests, page of 100 with one filter each (target+presence, tag, text, model+version, selector), "
        f"offsets 0-1000; matching devices per request {min(totals)}-{max(totals)}",
        f"- device list latency: p50 {p50:.1f} ms, p95 {p95:.1f} ms, max {max(times):.1f} ms "
        f"(goal p95 <= {GOAL_MS:.0f} ms: {verdict})",
        *renders,
    ]
    print("\n".join(lines))
    print(f"rerun: {command}")
    if args.doc:
        print(f"wrote {write_section('console', command, chr(10).join(lines))}")


if __name__ == "__main__":
    sys.exit(main())
