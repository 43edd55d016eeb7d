"""The parts of ``./scripts/bench fleet`` on PostgreSQL: replicated controllers, many light agents, HTTP against MQTT.

Everything runs for real on this machine: a PostgreSQL cluster of its own (tests/postgres.py),
Mosquitto, ``edgectl controller run`` processes on one ``postgresql://`` store (each with its own
``application_name``, so the holder of the engine lease can be read from ``leases`` and ``pg_stat_activity``), light
agents in ``edgectl sim`` processes, ``edgectl deploy --fleet``.

How each figure is taken:
- ingest: a trigger the benchmark adds to the store's ``devices`` table records, for every stored
  telemetry report, the device's send time and the database clock when the controller's UPDATE
  ran. Sent reports are counted by the agents themselves (``edgectl sim --json`` prints them per
  wall-clock second on exit), so the share stored is exact for the window's whole seconds.
- controller CPU: user + system seconds of the controller processes over the window (psutil).
- failover: SIGKILL the lease holder, then poll ``pg_locks`` until the other replica holds it.
- bytes a controller sent: ``bytes_sent`` of its TCP sockets (``ss -ti``, the kernel's tcp_info), so
  MQTT framing and every retransmitted chunk count.
"""

from __future__ import annotations

import json
import re
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edgecore.protocol.envelope import TrustedKeys  # noqa: E402
from edgectl.artifacts import RangeServer  # noqa: E402
from edgectl.artifacts.publish import export_payload  # noqa: E402
from edgectl.controller.leader import ENGINE_LEASE  # noqa: E402
from edgectl.controller.store import Store, open_url  # noqa: E402
from edgectl.keys import Keyring  # noqa: E402
from edgectl.package import BuildOptions, build_package, read_package  # noqa: E402
from tests.brokers import BrokerProcess, start_mosquitto  # noqa: E402
from tests.checkout import checkout_env  # noqa: E402
from tests.postgres import PostgresCluster, start_cluster  # noqa: E402

__all__ = ["ScaleBench", "Sim", "Window"]

MAX_PER_PROCESS = 300  # edgectl.cli.sim.MAX_PER_PROCESS: paho's select() loop stops at file descriptor 1024

TRIGGER = """
CREATE UNLOGGED TABLE IF NOT EXISTS bench_reports(device_id TEXT, sent DOUBLE PRECISION, stored DOUBLE PRECISION);
CREATE OR REPLACE FUNCTION bench_report() RETURNS trigger AS $$
BEGIN
    INSERT INTO bench_reports VALUES (NEW.id, NEW.telemetry_at, extract(epoch FROM clock_timestamp()));
    RETURN NULL;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER bench_report AFTER UPDATE OF telemetry_at ON devices FOR EACH ROW
    WHEN (NEW.telemetry_at IS DISTINCT FROM OLD.telemetry_at) EXECUTE FUNCTION bench_report();
"""
HOLDER = ("SELECT a.application_name FROM leases l JOIN pg_stat_activity a ON a.pid = l.holder_pid "
          "WHERE l.name = %s AND l.expires > extract(epoch FROM clock_timestamp())")


@dataclass
class Sim:
    """One ``edgectl sim`` process and what it said: its agents (connected or not), then its reports sent."""

    process: subprocess.Popen[str]
    agents: int = 0
    connected: int = 0
    sent: Counter[int] = field(default_factory=Counter)

    def read_listing(self) -> None:
        assert self.process.stdout is not None
        text = ""
        for line in self.process.stdout:
            text += line
            if line.rstrip() == "}":
                break
        listing = json.loads(text)
        self.agents, self.connected = len(listing["agents"]), int(listing["connected"])

    def stop(self) -> None:
        self.process.terminate()
        try:
            out, _ = self.process.communicate(timeout=60)
        except subprocess.TimeoutExpired:  # its count is lost with it
            self.process.kill()
            out, _ = self.process.communicate(timeout=10)
        for line in out.splitlines():
            if line.startswith('{"telemetry_sent"'):
                self.sent.update({int(k): v for k, v in json.loads(line)["telemetry_sent"].items()})


@dataclass
class Window:
    """A measurement window of whole seconds [start, end) and the CPU seconds each watched process used in it."""

    start: int
    end: int
    cpu: dict[str, float]


class ScaleBench:
    """PostgreSQL, Mosquitto, an EDGECTL_HOME with keys, and named controller processes on one postgresql:// store."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.home = work / "home"
        self.home.mkdir()
        self.broker: BrokerProcess = start_mosquitto(work / "broker")
        self.pg: PostgresCluster | None = None
        try:
            self.pg = start_cluster()
        except pytest.fail.Exception as exc:  # the fixture's one line saying what to install
            self.broker.stop()
            raise SystemExit(f"bench fleet: {exc}") from None
        self.db = self.pg.create_database()
        self.ring = Keyring(self.home / "keys")
        self.ring.init("package")
        self.ring.init("controller")
        self.env = checkout_env(EDGECTL_HOME=str(self.home), EDGECTL_BROKER=self.broker.url, EDGECTL_CONTROLLER__STORE=self.db,
                                PYTHONUNBUFFERED="1")
        self.controllers: dict[str, subprocess.Popen[bytes]] = {}
        self._store: Store | None = None

    # -- processes ------------------------------------------------------------------------------

    def start_controller(self, name: str) -> None:
        env = {**self.env, "EDGECTL_CONTROLLER__STORE": f"{self.db}&application_name={name}"}
        with (self.work / f"{name}.log").open("ab") as log:
            self.controllers[name] = subprocess.Popen([sys.executable, "-m", "edgectl.cli.main", "controller", "run"], env=env,
                                                      stdout=log, stderr=subprocess.STDOUT)

    def holder(self) -> str | None:
        """The application_name of the controller holding the engine lease, if one does."""
        import psycopg

        with psycopg.connect(self.db, autocommit=True, connect_timeout=5) as conn:
            try:
                row = conn.execute(HOLDER, (ENGINE_LEASE,)).fetchone()
            except psycopg.errors.UndefinedTable:  # the first controller has not migrated the store yet
                return None
        return None if row is None else str(row[0])

    def wait_leader(self, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc in self.controllers.items():
                if proc.poll() is not None:
                    log = (self.work / f"{name}.log").read_text().strip().splitlines()
                    raise RuntimeError(f"controller {name} exited {proc.returncode}: {log[-1] if log else 'no output'}")
            leader = self.holder()
            if leader is not None:
                return leader
            time.sleep(0.2)
        raise RuntimeError(f"no controller took the engine lease within {timeout:.0f} s")

    def install_trigger(self) -> None:
        """After the first controller migrated the store: record every stored telemetry report (see the module doc)."""
        import psycopg

        with psycopg.connect(self.db, autocommit=True) as conn:
            while conn.execute("SELECT to_regclass('devices')").fetchone()[0] is None:  # type: ignore[index]
                time.sleep(0.2)
            conn.execute(TRIGGER)

    def sims(self, agents: int, prefix: str, per_process: int, tag: str, telemetry_s: float) -> list[Sim]:
        """``edgectl sim`` processes of at most ``per_process`` agents, each with its listing read."""
        sims = []
        for k in range(0, agents, per_process):
            n = min(per_process, agents - k)
            argv = [sys.executable, "-m", "edgectl.cli.main", "sim", "--agents", str(n),
                    "--prefix", f"{prefix}{k // per_process}", "--tag", tag, "--state-dir", str(self.work / "sim"),
                    "--telemetry-s", str(telemetry_s), "--json"]
            sims.append(Sim(subprocess.Popen(argv, env=self.env, text=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)))
        for sim in sims:
            sim.read_listing()
        return sims

    def close(self) -> None:
        for proc in self.controllers.values():
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:  # starved on a saturated machine
                    proc.kill()
                    proc.wait(10)
        if self._store is not None:
            self._store.close()
        self.broker.stop()
        if self.pg is not None:
            self.pg.stop()

    # -- measurements ---------------------------------------------------------------------------

    def window(self, seconds: float) -> Window:
        """Wait for the next whole second, then measure for ``seconds``: CPU of the controllers, PostgreSQL, Mosquitto."""
        watched = self._watched()
        start = int(time.time()) + 1
        time.sleep(start - time.time())
        cpu0 = {k: _cpu(p) for k, p in watched.items()}
        end = start + round(seconds)
        time.sleep(max(0.0, end - time.time()))
        cpu1 = {k: _cpu(p) for k, p in watched.items()}
        return Window(start, end, {k: sum(t - cpu0[k][pid] for pid, t in cpu1[k].items() if pid in cpu0[k]) for k in watched})

    def _watched(self) -> dict[str, list[psutil.Process]]:
        assert self.pg is not None and self.broker.process is not None
        postmaster = next(p for p in psutil.process_iter(["cmdline"]) if str(self.pg.data) in " ".join(p.info["cmdline"] or []))
        watched = {f"controller {name}": [psutil.Process(p.pid)] for name, p in self.controllers.items() if p.poll() is None}
        watched["postgres"] = [postmaster, *postmaster.children(recursive=True)]
        watched["mosquitto"] = [psutil.Process(self.broker.process.pid)]
        return watched

    def _query(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        import psycopg

        with psycopg.connect(self.db, autocommit=True) as conn:
            return conn.execute(sql, params).fetchone()[0]  # type: ignore[index]

    def catch_up(self, fresh_s: float, timeout: float) -> float | None:
        """Wait until the reports being stored now are younger than ``fresh_s``; seconds waited, None if never."""
        began = time.monotonic()
        while time.monotonic() - began < timeout:
            lag = self._query("SELECT max(stored - sent) FROM bench_reports "
                              "WHERE stored > extract(epoch FROM clock_timestamp()) - 1")
            if lag is not None and lag < fresh_s:
                return time.monotonic() - began
            time.sleep(1)
        return None

    def drain(self, window: Window, quiet_s: float = 3, timeout: float = 30) -> None:
        """Until no more reports sent in ``window`` are being stored (a replica's queue emptied), at most ``timeout``."""
        began, count, since = time.monotonic(), -1, time.monotonic()
        while time.monotonic() - began < timeout and time.monotonic() - since < quiet_s:
            now = self._query("SELECT count(*) FROM bench_reports WHERE sent >= %s AND sent < %s", (window.start, window.end))
            if now != count:
                count, since = now, time.monotonic()
            time.sleep(0.5)

    def ingest(self, window: Window, sent: Counter[int]) -> dict[str, Any]:
        """Reports sent in the window's seconds, those stored, their lag; CPU per 1,000 stored."""
        import psycopg

        with psycopg.connect(self.db, autocommit=True) as conn:
            rows = conn.execute("SELECT stored - sent FROM bench_reports WHERE sent >= %s AND sent < %s",
                                (window.start, window.end)).fetchall()
            # CPU per report by what the controllers stored during the window, whenever it was sent
            processed = conn.execute("SELECT count(*) FROM bench_reports WHERE stored >= %s AND stored < %s",
                                     (window.start, window.end)).fetchone()[0]  # type: ignore[index]
        lags = sorted(float(r[0]) for r in rows)
        sent_n = sum(sent[s] for s in range(window.start, window.end))
        seconds = window.end - window.start
        controller_cpu = sum(v for k, v in window.cpu.items() if k.startswith("controller"))
        return {"seconds": seconds, "sent": sent_n, "stored": len(lags), "share": len(lags) / max(sent_n, 1),
                "p50": statistics.median(lags) if lags else float("nan"),
                "p95": lags[int(0.95 * (len(lags) - 1))] if lags else float("nan"), "max": lags[-1] if lags else float("nan"),
                "controller_cpu": controller_cpu / seconds, "processed": processed,
                "cpu_per_1000": controller_cpu / max(processed, 1) * 1000,
                "cpu": {k: v / seconds for k, v in window.cpu.items()}}

    def failover(self, timeout: float = 60) -> tuple[str, str, float]:
        """SIGKILL the lease holder; seconds until another controller holds the lease."""
        leader = self.wait_leader()
        killed = self.controllers[leader]
        began = time.monotonic()
        killed.send_signal(signal.SIGKILL)
        killed.wait(10)
        while time.monotonic() - began < timeout:
            holder = self.holder()
            if holder is not None and holder != leader:
                return leader, holder, time.monotonic() - began
            time.sleep(0.02)
        raise RuntimeError(f"no controller took the lease within {timeout:.0f} s of killing {leader}")

    def sent_bytes(self, name: str) -> int:
        """Bytes the controller ``name`` has sent on its open TCP sockets (the kernel's count)."""
        ports = {c.laddr.port for c in psutil.Process(self.controllers[name].pid).net_connections("tcp")}
        out = subprocess.run(["ss", "-tinH"], capture_output=True, text=True, check=True).stdout
        total, port = 0, None
        for line in out.splitlines():
            if not line.startswith((" ", "\t")):
                local = line.split()[3] if len(line.split()) > 3 else ""
                port = int(local.rsplit(":", 1)[1]) if ":" in local else None
            elif port in ports and (m := re.search(r"\bbytes_sent:(\d+)", line)):
                total += int(m[1])
        return total

    # -- rollouts -------------------------------------------------------------------------------

    def package(self, size_mb: float) -> tuple[Path, Any]:
        from bench_delivery import big_model

        model = big_model(self.work / "big.onnx", size_mb)
        path = self.work / "big-1.edgepkg"
        build_package(model, BuildOptions("big", 1), self.ring.signing_key("package"), path)
        workdir = self.work / "read"
        workdir.mkdir()
        return path, read_package(path, TrustedKeys([self.ring.signing_key("package").public_key()]), workdir)

    def serve(self, package: Any) -> RangeServer:
        """The payload over HTTP with Range from this process (its bytes_sent counts what devices fetched)."""
        root = self.work / "served"
        export_payload(package, root)
        return RangeServer(root).start()

    def rollout(self, package: Path, selector: str, controller: str, urls: list[str]) -> dict[str, Any]:
        """`edgectl deploy --fleet` in one wave; seconds to the store's done and bytes the controller sent meanwhile."""
        before = self.sent_bytes(controller)
        start = time.perf_counter()
        extra = [a for url in urls for a in ("--artifact-url", url)]
        argv = [sys.executable, "-m", "edgectl.cli.main", "deploy", str(package), "--fleet", selector, "--waves", "100%",
                "--bake", "0s", "--json", *extra]
        proc = subprocess.run(argv, env=self.env, text=True, capture_output=True, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"edgectl deploy exited {proc.returncode}: {proc.stderr.strip()}")
        rollout_id = json.loads(proc.stdout)["rollout_id"]
        if self._store is None:
            self._store = open_url(self.db, packages_dir=self.work / "read-packages")
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            row = self._store.rollout(rollout_id)
            if row is not None and row.status in ("done", "rolled-back", "aborted"):
                if row.status != "done":
                    raise RuntimeError(f"rollout {rollout_id} ended {row.status}: {row.reason}")
                wall = time.perf_counter() - start
                devices = len(self._store.rollout_devices(rollout_id))
                return {"wall": wall, "bytes": self.sent_bytes(controller) - before, "devices": devices}
            time.sleep(0.2)
        raise RuntimeError(f"rollout {rollout_id} did not finish within 600 s")


def _cpu(procs: list[psutil.Process]) -> dict[int, float]:
    """User + system CPU seconds of each process still there (a PostgreSQL backend may have ended)."""
    seconds = {}
    for p in procs:
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        seconds[p.pid] = t.user + t.system
    return seconds
