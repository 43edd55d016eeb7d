"""Fleet control-plane benchmark over one Mosquitto (``./scripts/bench fleet [--agents 1000] [--rollout-agents 200]``).

1. Telemetry ingest: N light agents (`edgectl sim` processes of 250, one MQTT connection each) report telemetry once a
   second to a real ``edgectl controller run`` process. Measured over a window: the ingest lag of
   every stored report (controller receive time minus the agent's send time, read from the
   controller's store), the controller's CPU use, and reports stored per second against reports sent.
2. Rollout fan-out: a ~5 MB signed package rolled out by ``edgectl deploy --fleet`` in one wave
   (bake 0) to 1 light agent, then to M light agents (in `edgectl sim` processes of 50, so they use
   every core); time from submit to the rollout's ``done``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_delivery import big_model  # noqa: E402
from benchdoc import machine, write_section  # noqa: E402

from edgectl.controller import SqliteStore  # noqa: E402
from edgectl.keys import Keyring  # noqa: E402
from edgectl.package import BuildOptions, build_package  # noqa: E402
from tests.brokers import start_mosquitto  # noqa: E402
from tests.checkout import checkout_env  # noqa: E402

COMMAND = "./scripts/bench fleet"
LAG_GOAL_S, FANOUT_GOAL = 1.0, 2.0  # keeping up: p95 ingest lag under one telemetry period
PER_PROCESS = 250  # light agents per `edgectl sim` process (paho's select() loop stops at file descriptor 1024)
ROLLOUT_PER_PROCESS = 50  # every one of them downloads, hashes and writes the package: spread them over the cores


class Bench:
    """One broker, one controller process, an EDGECTL_HOME with keys; light agents run in `edgectl sim` processes."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.home = work / "home"
        self.home.mkdir()
        self.broker = start_mosquitto(work / "broker")
        self.env = checkout_env(EDGECTL_HOME=str(self.home), EDGECTL_BROKER=self.broker.url, PYTHONUNBUFFERED="1")
        os.environ.update(EDGECTL_HOME=str(self.home))
        self.ring = Keyring(self.home / "keys")
        self.ring.init("package")
        self.ring.init("controller")
        self.controller = subprocess.Popen([sys.executable, "-m", "edgectl.cli.main", "controller", "run"], env=self.env,
                                           stdout=subprocess.DEVNULL, stderr=open(work / "controller.log", "w"))
        self.store = self.home / "controller.db"

    def wait_controller(self, timeout: float = 30) -> None:
        """Until the controller process has created its store; fail with its log if it died."""
        deadline = time.monotonic() + timeout
        while not self.store.exists():
            if self.controller.poll() is not None or time.monotonic() > deadline:
                log = (self.work / "controller.log").read_text().strip().splitlines()
                raise RuntimeError(f"the controller did not start: {log[-1] if log else 'no output'}")
            time.sleep(0.1)

    def edgectl(self, *args: str) -> str:
        proc = subprocess.run([sys.executable, "-m", "edgectl.cli.main", *args], env=self.env, text=True,
                              capture_output=True, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"edgectl {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc.stdout

    def close(self) -> None:
        self.controller.terminate()
        self.controller.wait(30)
        self.broker.stop()


def sim_processes(bench: Bench, agents: int, prefix: str, per_process: int = PER_PROCESS, tag: str = "bench=telemetry") -> list[subprocess.Popen[str]]:
    """``edgectl sim`` processes of at most ``per_process`` agents each, connected; device ids start with ``prefix``."""
    procs = []
    for k in range(0, agents, per_process):
        n = min(per_process, agents - k)
        procs.append(subprocess.Popen([sys.executable, "-m", "edgectl.cli.main", "sim", "--agents", str(n), "--prefix", f"{prefix}{k // per_process}",
                                       "--tag", tag, "--state-dir", str(bench.work / "sim"), "--json"], env=bench.env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL))
    for proc in procs:
        assert proc.stdout is not None
        text = ""
        for line in proc.stdout:
            text += line
            if line.rstrip() == "}":
                break
        listing = json.loads(text)
        assert listing["connected"] == len(listing["agents"]), f"only {listing['connected']} of {len(listing['agents'])} connected"
    return procs


def ingest(bench: Bench, agents: int, seconds: float) -> dict[str, Any]:
    """Telemetry from ``agents`` light agents for ``seconds``: lag of every stored report, controller CPU."""
    bench.wait_controller()
    print(f"telemetry ingest: starting {agents} light agents in {-(-agents // PER_PROCESS)} `edgectl sim` processes ...", flush=True)
    began = time.monotonic()
    procs = sim_processes(bench, agents, "tel")
    print(f"  {agents} connected in {time.monotonic() - began:.0f} s; warming up ...", flush=True)
    time.sleep(5)
    watched = [psutil.Process(bench.controller.pid), psutil.Process(bench.broker.process.pid)] + [psutil.Process(p.pid) for p in procs]  # type: ignore[union-attr]
    cpu0 = [sum(p.cpu_times()[:2]) for p in watched]
    seen: dict[str, float] = {}
    lags: list[float] = []
    store = SqliteStore(bench.store)  # read side: the controller process writes
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        time.sleep(0.5)
        for row in store.devices():
            sent = row.telemetry.get("ts")
            if row.id.startswith("tel") and sent is not None and row.telemetry_ts is not None and seen.get(row.id) != sent:
                seen[row.id] = sent
                lags.append(row.telemetry_ts - sent)
    wall = time.monotonic() - start
    cpu = [sum(p.cpu_times()[:2]) - c for p, c in zip(watched, cpu0, strict=False)]
    for proc in procs:
        proc.terminate()
        proc.wait(30)
    lags.sort()
    return {"agents": agents, "seconds": wall, "stored": len(lags), "sent_rate": float(agents),
            "p50": statistics.median(lags), "p95": lags[int(0.95 * (len(lags) - 1))], "max": lags[-1],
            "controller_cpu": cpu[0] / wall, "broker_cpu": cpu[1] / wall, "agents_cpu": sum(cpu[2:]) / wall}


def rollout(bench: Bench, package: Path, selector: str) -> tuple[float, float]:
    """(seconds from `edgectl deploy --fleet` to the rollout's done in the store, of which the command itself)."""
    start = time.perf_counter()
    out = bench.edgectl("deploy", str(package), "--fleet", selector, "--waves", "100%", "--bake", "0s", "--json")
    submitted = time.perf_counter() - start
    rollout_id = json.loads(out)["rollout_id"]
    store = SqliteStore(bench.store)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        row = store.rollout(rollout_id)
        if row is not None and row.status in ("done", "rolled-back", "aborted"):
            if row.status != "done":
                raise RuntimeError(f"rollout {rollout_id} ended {row.status}: {row.reason}")
            return time.perf_counter() - start, submitted
        time.sleep(0.1)
    raise RuntimeError(f"rollout {rollout_id} did not finish within 600 s")


def fanout(bench: Bench, many: int, size_mb: float) -> dict[str, Any]:
    model = big_model(bench.work / "big.onnx", size_mb)
    packages = []
    for version in (1, 2):
        out = bench.work / f"big-{version}.edgepkg"
        build_package(model, BuildOptions("big", version), bench.ring.signing_key("package"), out)
        packages.append(out)
    print(f"rollout: {packages[0].stat().st_size / 1e6:.1f} MB package to 1 agent, then to {many} ...", flush=True)
    procs = sim_processes(bench, 1, "one", tag="bench=one") + sim_processes(bench, many, "many", ROLLOUT_PER_PROCESS, "bench=many")
    time.sleep(3)  # births reach the broker's retained store before `deploy` lists devices
    try:
        one, one_cmd = rollout(bench, packages[0], "bench=one")
        print(f"  1 agent: {one:.2f} s", flush=True)
        all_many, many_cmd = rollout(bench, packages[1], "bench=many")
        print(f"  {many} agents: {all_many:.2f} s", flush=True)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(30)
    return {"size": packages[0].stat().st_size, "one": one, "many": all_many, "count": many, "one_cmd": one_cmd, "many_cmd": many_cmd}


def report(tel: dict[str, Any], fan: dict[str, Any], command: str) -> str:
    ratio = fan["many"] / fan["one"]
    lag_ok = tel["p95"] < LAG_GOAL_S and tel["stored"] >= 0.9 * tel["sent_rate"] * tel["seconds"]
    return "\n".join([
        f"Machine: {machine()}. Command: `{command}`.",
        "",
        "| measurement | value | ratio | goal | result |",
        "|---|---|---|---|---|",
        f"| telemetry: {tel['agents']} light agents, one report per second each, for {tel['seconds']:.0f} s"
        f" | {tel['stored']} reports stored ({tel['stored'] / tel['seconds']:.0f}/s, sent {tel['sent_rate']:.0f}/s) | | | |",
        f"| ingest lag (store time minus send time) | p50 {tel['p50'] * 1000:.0f} ms, p95 {tel['p95'] * 1000:.0f} ms,"
        f" max {tel['max'] * 1000:.0f} ms | | p95 < {LAG_GOAL_S:.0f} s and >= 90% stored | {'PASS' if lag_ok else 'FAIL'} |",
        f"| CPU while ingesting (cores busy) | controller {tel['controller_cpu']:.2f}, Mosquitto {tel['broker_cpu']:.2f},"
        f" the {tel['agents']} light agents {tel['agents_cpu']:.2f} | | | |",
        f"| rollout of a {fan['size'] / 1e6:.1f} MB package to 1 light agent (deploy -> done)"
        f" | {fan['one']:.2f} s (`edgectl deploy` itself {fan['one_cmd']:.2f} s) | | | |",
        f"| same to {fan['count']} light agents | {fan['many']:.2f} s (`edgectl deploy` itself {fan['many_cmd']:.2f} s) | time({fan['count']})/time(1) = {ratio:.2f}"
        f" | < {FANOUT_GOAL:.0f} | {'PASS' if ratio < FANOUT_GOAL else 'FAIL'} |",
        "",
        f"The {fan['count']} light agents share this machine's {os.cpu_count()} cores: each one verifies, hashes and"
        " writes the whole package, so their own work grows with their number while the controller's bytes do not"
        " (see `## delivery`).",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=1000, help="light agents sending telemetry (default 1000)")
    parser.add_argument("--seconds", type=float, default=20.0, help="telemetry measurement window (default 20)")
    parser.add_argument("--rollout-agents", type=int, default=200, help="light agents in the rollout (default 200)")
    parser.add_argument("--size-mb", type=float, default=5.0, help="model size in MiB (default 5)")
    parser.add_argument("--no-docs", action="store_true", help="do not write the figures into docs/benchmarks.md")
    args = parser.parse_args()
    defaults = {k: parser.get_default(k) for k in ("agents", "seconds", "rollout_agents", "size_mb")}
    command = COMMAND + "".join(f" --{k.replace('_', '-')} {getattr(args, k)}" for k, v in defaults.items() if getattr(args, k) != v)
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        bench = Bench(Path(tmp))
        try:
            tel = ingest(bench, args.agents, args.seconds)
            fan = fanout(bench, args.rollout_agents, args.size_mb)
        finally:
            bench.close()
    body = report(tel, fan, command)
    print()
    print(body)
    print(f"\nwall time {time.monotonic() - began:.0f} s; rerun: {command}")
    if not args.no_docs:
        print(f"figures written to {write_section('fleet', command, body).relative_to(ROOT)} (## fleet)")


if __name__ == "__main__":
    main()
