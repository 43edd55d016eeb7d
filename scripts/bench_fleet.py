"""Fleet control-plane benchmark (``./scripts/bench fleet [--parts sqlite,scale,http] ...``), in one run.

sqlite (section ``## fleet``), one controller on its SQLite store and one Mosquitto:
1. Telemetry ingest: N light agents (`edgectl sim` processes of 250, one MQTT connection each) report telemetry once a
   second to a real ``edgectl controller run`` process. Measured over a window: the ingest lag of
   every stored report (controller receive time minus the agent's send time, read from the
   controller's store), the controller's CPU use, and reports stored per second against reports sent.
2. Rollout fan-out: a ~5 MB signed package rolled out by ``edgectl deploy --fleet`` in one wave
   (bake 0) to 1 light agent, then to M light agents (in `edgectl sim` processes of 50, so they use
   every core); time from submit to the rollout's ``done``.

scale (section ``## fleet at scale``), controllers on a PostgreSQL store (scripts/fleet_scale.py says how each
figure is taken):
3. Ingest from ``--scale-agents`` light agents (processes of at most 300) with 1, then 2 controller
   replicas: p95 lag from send to the store, share of the reports sent that were stored, controller
   CPU per 1,000 reports stored.
4. Leader failover: SIGKILL the replica holding the engine lease; seconds until the other holds it.
5. A ``--http-size-mb`` package rolled out to ``--rollout-agents`` light agents with ``--artifact-url``
   (HTTP Range from a server of the payload) and to as many others over MQTT chunks: wall time and
   the bytes the controller sent.

http (in ``## fleet at scale``):
6. The agent's HTTP chunk download (HttpFetch) against curl on the same file and server (scripts/bench_http.py).
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

from collections import Counter  # noqa: E402

from bench_delivery import big_model  # noqa: E402
from bench_http import GOAL as HTTP_GOAL  # noqa: E402
from bench_http import measure as measure_http  # noqa: E402
from benchdoc import machine, write_section  # noqa: E402
from fleet_scale import MAX_PER_PROCESS, ScaleBench, Sim  # noqa: E402

from edgectl.controller import SqliteStore  # noqa: E402
from edgectl.keys import Keyring  # noqa: E402
from edgectl.package import BuildOptions, build_package  # noqa: E402
from tests.brokers import start_mosquitto  # noqa: E402
from tests.checkout import checkout_env  # noqa: E402

COMMAND = "./scripts/bench fleet"
LAG_GOAL_S, FANOUT_GOAL = 1.0, 2.0  # keeping up: p95 ingest lag under one telemetry period
PER_PROCESS = 250  # light agents per `edgectl sim` process (paho's select() loop stops at file descriptor 1024)
CATCH_UP_S = 90.0  # at most this long for the controllers to work off the agents' births before a window
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
        with (work / "controller.log").open("w") as log:
            self.controller = subprocess.Popen([sys.executable, "-m", "edgectl.cli.main", "controller", "run"], env=self.env,
                                               stdout=subprocess.DEVNULL, stderr=log)
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


def sim_processes(bench: Bench, agents: int, prefix: str, per_process: int = PER_PROCESS,
                  tag: str = "bench=telemetry") -> list[subprocess.Popen[str]]:
    """``edgectl sim`` processes of at most ``per_process`` agents each, connected; device ids start with ``prefix``."""
    procs = []
    for k in range(0, agents, per_process):
        n = min(per_process, agents - k)
        argv = [sys.executable, "-m", "edgectl.cli.main", "sim", "--agents", str(n), "--prefix", f"{prefix}{k // per_process}",
                "--tag", tag, "--state-dir", str(bench.work / "sim"), "--json"]
        procs.append(subprocess.Popen(argv, env=bench.env, text=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL))
    for proc in procs:
        assert proc.stdout is not None
        text = ""
        for line in proc.stdout:
            text += line
            if line.rstrip() == "}":
                break
        listing = json.loads(text)
        wanted = len(listing["agents"])
        assert listing["connected"] == wanted, f"only {listing['connected']} of {wanted} connected"
    return procs


def ingest(bench: Bench, agents: int, seconds: float) -> dict[str, Any]:
    """Telemetry from ``agents`` light agents for ``seconds``: lag of every stored report, controller CPU."""
    bench.wait_controller()
    print(f"telemetry ingest: starting {agents} light agents in {-(-agents // PER_PROCESS)} `edgectl sim` processes ...",
          flush=True)
    began = time.monotonic()
    procs = sim_processes(bench, agents, "tel")
    print(f"  {agents} connected in {time.monotonic() - began:.0f} s; warming up ...", flush=True)
    time.sleep(5)
    assert bench.broker.process is not None
    watched = [psutil.Process(bench.controller.pid), psutil.Process(bench.broker.process.pid)]
    watched += [psutil.Process(p.pid) for p in procs]
    cpu0 = [sum(p.cpu_times()[:2]) for p in watched]
    seen: dict[str, float] = {}
    lags: list[float] = []
    store = SqliteStore(bench.store)  # read side: the controller process writes
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        time.sleep(0.5)
        for row in store.devices():
            sent = row.telemetry.ts if row.telemetry else None
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
    procs = sim_processes(bench, 1, "one", tag="bench=one")
    procs += sim_processes(bench, many, "many", ROLLOUT_PER_PROCESS, "bench=many")
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
    return {"size": packages[0].stat().st_size, "one": one, "many": all_many, "count": many, "one_cmd": one_cmd,
            "many_cmd": many_cmd}


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
        f"| same to {fan['count']} light agents | {fan['many']:.2f} s (`edgectl deploy` itself {fan['many_cmd']:.2f} s)"
        f" | time({fan['count']})/time(1) = {ratio:.2f}"
        f" | < {FANOUT_GOAL:.0f} | {'PASS' if ratio < FANOUT_GOAL else 'FAIL'} |",
        "",
        f"The {fan['count']} light agents share this machine's {os.cpu_count()} cores: each one verifies, hashes and"
        " writes the whole package, so their own work grows with their number while the controller's bytes do not"
        " (see `## delivery`).",
    ])


def scale(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Sections 3-5: PostgreSQL, 1 then 2 replicas under ``--scale-agents``, failover, HTTP against MQTT rollouts."""
    bench = ScaleBench(work)
    try:
        bench.start_controller("ctl-a")
        bench.wait_leader()
        bench.install_trigger()
        per = args.per_process
        print(f"scale: starting {args.scale_agents} light agents in {-(-args.scale_agents // per)} `edgectl sim` processes"
              f" (telemetry every {args.scale_telemetry_s:g} s) ...", flush=True)
        began = time.monotonic()
        sims = bench.sims(args.scale_agents, "tel", per, "bench=telemetry", args.scale_telemetry_s)
        print(f"  {sum(s.connected for s in sims)} of {args.scale_agents} connected in {time.monotonic() - began:.0f} s",
              flush=True)
        return _measure_scale(bench, sims, args)
    finally:
        bench.close()


def _measure_scale(bench: ScaleBench, sims: list[Sim], args: argparse.Namespace) -> dict[str, Any]:
    connected = sum(s.connected for s in sims)
    try:
        # Births and retained states of every agent come first: measure once the reports stored are fresh again.
        fresh = max(2.0, args.scale_telemetry_s)
        settle = [bench.catch_up(fresh, CATCH_UP_S)]
        one = bench.window(args.scale_seconds)
        print(f"  1 replica measured (caught up after {_took(settle[0])}); starting a second", flush=True)
        bench.start_controller("ctl-b")
        time.sleep(2 * args.scale_telemetry_s)  # the second replica subscribed, its retained messages read
        settle.append(bench.catch_up(fresh, CATCH_UP_S))
        two = bench.window(args.scale_seconds)
        bench.drain(two)  # the leader's queue is lost with it: let the window's reports land first
        print(f"  2 replicas measured (caught up after {_took(settle[1])}); SIGKILL of the leader", flush=True)
        killed, leader, failover_s = bench.failover()
        print(f"  {leader} holds the lease {failover_s:.2f} s after {killed} was killed", flush=True)
    finally:
        sent: Counter[int] = Counter()
        for sim in sims:
            sim.stop()
            sent.update(sim.sent)
    time.sleep(5)  # reports still queued are stored too (they count, with their lag)
    result: dict[str, Any] = {"agents": args.scale_agents, "connected": connected, "telemetry_s": args.scale_telemetry_s,
                              "one": bench.ingest(one, sent), "two": bench.ingest(two, sent),
                              "failover": failover_s, "processes": len(sims), "settle": settle}
    result.update(rollouts(bench, leader, args))
    return result


def _took(seconds: float | None) -> str:
    return f"{seconds:.0f} s" if seconds is not None else f"NOT within {CATCH_UP_S:.0f} s: measured with a backlog"


def rollouts(bench: ScaleBench, controller: str, args: argparse.Namespace) -> dict[str, Any]:
    path, package = bench.package(args.http_size_mb)
    server = bench.serve(package)
    n = args.rollout_agents
    print(f"rollout: {path.stat().st_size / 1e6:.1f} MB package to {n} light agents over HTTP, then {n} over MQTT ...",
          flush=True)
    sims: list[Sim] = []
    try:
        sims = (bench.sims(n, "http", ROLLOUT_PER_PROCESS, "bench=http", 5.0)
                + bench.sims(n, "mqtt", ROLLOUT_PER_PROCESS, "bench=mqtt", 5.0))
        time.sleep(5)  # births reach the controller before `deploy` lists devices
        http = bench.rollout(path, "bench=http", controller, [server.url_of(package.manifest.artifact_id)])
        http["origin"] = server.bytes_sent
        print(f"  HTTP: {http['wall']:.1f} s, controller sent {http['bytes'] / 1e6:.2f} MB", flush=True)
        mqtt = bench.rollout(path, "bench=mqtt", controller, [])
        print(f"  MQTT: {mqtt['wall']:.1f} s, controller sent {mqtt['bytes'] / 1e6:.2f} MB", flush=True)
    finally:
        for sim in sims:
            sim.stop()
        server.stop()
    return {"size": path.stat().st_size, "payload": package.manifest.payload.size, "http": http, "mqtt": mqtt,
            "rollout_connected": sum(s.connected for s in sims)}


def scale_report(sc: dict[str, Any] | None, http: dict[str, Any] | None, command: str) -> str:
    lines = [f"Machine: {machine()}. Command: `{command}`.", ""]
    if sc is not None:
        lines += _scale_lines(sc)
    if http is not None:
        mb = http["size"] / 1e6
        lines += ["", "| HTTP chunk download, same file and server | value | goal | result |", "|---|---|---|---|",
                  f"| curl, {mb:.0f} MB, best of {http['runs']} | {mb / http['curl_s']:.0f} MB/s | | |",
                  f"| agent HttpFetch ({http['chunk_kib']} KiB chunks: Range, sha256 each, pwrite, fsync) |"
                  f" {mb / http['agent_s']:.0f} MB/s | | |",
                  f"| agent / curl throughput | {http['ratio']:.2f} | >= {HTTP_GOAL} |"
                  f" {'PASS' if http['ratio'] >= HTTP_GOAL else 'FAIL'} |"]
    return "\n".join(lines)


def _scale_lines(sc: dict[str, Any]) -> list[str]:
    rows = []
    for label, m, settle in (("1 controller", sc["one"], sc["settle"][0]), ("2 replicas", sc["two"], sc["settle"][1])):
        cpu = ", ".join(f"{k} {v:.2f}" for k, v in m["cpu"].items())
        rows.append(f"| {label} (caught up after {_took(settle)}) | {m['sent']} sent, {m['stored']} stored ({m['share']:.1%})"
                    f" | p50 {m['p50'] * 1000:.0f} ms, p95 {m['p95'] * 1000:.0f} ms, max {m['max'] * 1000:.0f} ms"
                    f" | {m['cpu_per_1000']:.2f} s ({m['processed']} stored in the window) | {cpu} |")
    h, q = sc["http"], sc["mqtt"]
    return [
        f"PostgreSQL store; {sc['connected']} of {sc['agents']} light agents connected ({sc['processes']} `edgectl sim`"
        f" processes of at most {MAX_PER_PROCESS}), one telemetry report every {sc['telemetry_s']:g} s each;"
        f" windows of {sc['one']['seconds']} s.",
        "",
        "| controllers | telemetry reports in the window | lag, send to store | controller CPU per 1,000 stored"
        " | CPU (cores busy) |",
        "|---|---|---|---|---|",
        *rows,
        "",
        "| measurement | value |",
        "|---|---|",
        f"| leader failover (SIGKILL of the lease holder -> the other replica holds the lease) | {sc['failover']:.2f} s |",
        f"| rollout of a {sc['size'] / 1e6:.1f} MB package to {h['devices']} light agents over HTTP (deploy -> done)"
        f" | {h['wall']:.1f} s; controller sent {h['bytes'] / 1e6:.2f} MB; the HTTP server {h['origin'] / 1e6:.0f} MB |",
        f"| same package to {q['devices']} other light agents over MQTT chunks | {q['wall']:.1f} s; controller sent"
        f" {q['bytes'] / 1e6:.2f} MB |",
        f"| MQTT / HTTP | wall time {q['wall'] / h['wall']:.2f}x, controller bytes {q['bytes'] / max(h['bytes'], 1):.0f}x |",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="sqlite,scale,http", help="which parts run (default sqlite,scale,http)")
    parser.add_argument("--agents", type=int, default=1000, help="sqlite: light agents sending telemetry (default 1000)")
    parser.add_argument("--seconds", type=float, default=20.0, help="sqlite: telemetry measurement window (default 20)")
    parser.add_argument("--rollout-agents", type=int, default=200, help="light agents in each rollout (default 200)")
    parser.add_argument("--size-mb", type=float, default=5.0, help="sqlite: model size in MiB (default 5)")
    parser.add_argument("--scale-agents", type=int, default=5000, help="scale: light agents on PostgreSQL (default 5000)")
    parser.add_argument("--per-process", type=int, default=MAX_PER_PROCESS, help="scale: light agents per `edgectl sim` (<= 300)")
    parser.add_argument("--scale-telemetry-s", type=float, default=5.0, help="scale: seconds between reports (default 5)")
    parser.add_argument("--scale-seconds", type=float, default=15.0, help="scale: each measurement window (default 15)")
    parser.add_argument("--http-size-mb", type=float, default=10.0, help="scale: package for HTTP vs MQTT (default 10 MiB)")
    parser.add_argument("--http-mb", type=int, default=64, help="http: file size for agent vs curl (default 64 MiB)")
    parser.add_argument("--no-docs", action="store_true", help="do not write the figures into docs/benchmarks.md")
    args = parser.parse_args()
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    if not parts or parts - {"sqlite", "scale", "http"}:
        parser.error(f"--parts: {args.parts!r}: a comma-separated list of sqlite, scale, http")
    if not 1 <= args.per_process <= MAX_PER_PROCESS:
        parser.error(f"--per-process: at most {MAX_PER_PROCESS} light agents per `edgectl sim` process")
    names = ("parts", "agents", "seconds", "rollout_agents", "size_mb", "scale_agents", "per_process", "scale_telemetry_s",
             "scale_seconds", "http_size_mb", "http_mb")
    command = COMMAND + "".join(f" --{k.replace('_', '-')} {getattr(args, k)}" for k in names
                                if getattr(args, k) != parser.get_default(k))
    began = time.monotonic()
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    bodies: dict[str, str] = {}
    if "sqlite" in parts:
        with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
            bench = Bench(Path(tmp))
            try:
                tel = ingest(bench, args.agents, args.seconds)
                fan = fanout(bench, args.rollout_agents, args.size_mb)
            finally:
                bench.close()
        bodies["fleet"] = report(tel, fan, command)
    sc = http = None
    if "scale" in parts:
        with tempfile.TemporaryDirectory(prefix="bench-fleet-scale-") as tmp:
            sc = scale(Path(tmp), args)
    if "http" in parts:
        print(f"http: the agent's chunk download against curl, {args.http_mb} MiB ...", flush=True)
        http = measure_http(args.http_mb, 64, 3)
    if sc is not None or http is not None:
        bodies["fleet at scale"] = scale_report(sc, http, command)
    load = f"Load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())} (1, 5, 15 min)."
    for name, body in bodies.items():
        body = f"{body}\n\n{load}"
        print(f"\n## {name}\n\n{body}")
        if not args.no_docs:
            print(f"figures written to {write_section(name, command, body).relative_to(ROOT)} (## {name})")
    print(f"\nwall time {time.monotonic() - began:.0f} s; rerun: {command}")


if __name__ == "__main__":
    main()
