"""Many models on one agent: part 4 of ``./scripts/bench agent`` (``--only multimodel``).

Real Mosquitto, real ``edge-agent`` processes, desired sets (schema 2) signed as a controller signs
them, the local HTTP API with binary tensors:

1. Swaps beside a served model. Three models on two agents; one of them (``moving``) is updated 20
   times on both while a client per agent sends requests to another (``steady``) without pause.
   Figures: failed requests on ``steady`` (goal: 0), and its p99 latency while the swaps run against
   quiet windows before and after them in the same run.
2. What each more model costs. An agent serving one model and an agent serving four (the same
   small classifier architecture, other weights) side by side: idle resident memory per additional
   model (and the footprints the agent measured and reports), and the latency of requests to the
   same model on either agent in alternating blocks (goal: four-model / one-model p50 <= 1.1x).
"""

from __future__ import annotations

import http.client
import json
import os
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from benchdoc import machine

from edgectl.examples import tiny_classifier
from edgectl.package import Package
from tests.brokers import start_mosquitto
from tests.deploy.controller import Controller
from tests.fleet import AgentProcess, EdgectlHome, wait_for

__all__ = ["MultiReport", "measure_multimodel", "multimodel_markdown", "multimodel_verdicts"]

OVERHEAD_GOAL = 1.1
FAST = {"request_interval_s": 0.5, "selection_budget_s": 0.3, "health_runs": 2, "crash_loop_max_deaths": 1000}


@dataclass
class Hammer:
    """Requests to one model of one agent, back to back on one kept-alive connection, until stopped."""

    agent: AgentProcess
    model: str
    samples: list[tuple[float, float, bool]] = field(default_factory=list)  # (when, seconds, ok)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        body, headers = _request(np.random.default_rng(0).random((1, 3, 32, 32), dtype=np.float32))
        connection = http.client.HTTPConnection("127.0.0.1", self.agent.http_port, timeout=30)
        while not self.stop.is_set():
            start = time.perf_counter()
            try:
                connection.request("POST", f"/v2/models/{self.model}/infer", body, headers)
                response = connection.getresponse()
                response.read()
                ok = response.status == 200
            except (OSError, http.client.HTTPException):
                ok = False
                connection.close()
                connection = http.client.HTTPConnection("127.0.0.1", self.agent.http_port, timeout=30)
            self.samples.append((time.monotonic(), time.perf_counter() - start, ok))
        connection.close()


def _request(image: np.ndarray) -> tuple[bytes, dict[str, str]]:
    header = json.dumps({"inputs": [{"name": "image", "shape": list(image.shape), "datatype": "FP32",
                                     "parameters": {"binary_data_size": image.nbytes}}],
                         "outputs": [{"name": "probabilities", "parameters": {"binary_data": True}}]}).encode()
    return header + image.tobytes(), {"Inference-Header-Content-Length": str(len(header)),
                                      "Content-Type": "application/octet-stream"}


@dataclass
class MultiReport:
    updates: int
    swaps_s: float
    requests: dict[str, int]  # phase -> requests to steady
    failed: dict[str, int]  # phase -> failed requests to steady
    p99_ms: dict[str, float]  # phase -> p99 of steady
    p50_ms: dict[str, float]
    rss_mb: dict[str, float]  # "1 model", "4 models"
    footprints_mb: dict[str, float]  # per model of the four-model agent, as its state reports them
    overhead: dict[str, float]  # "1 model", "4 models" -> p50 ms of the same model; "ratio"
    rounds: int


def measure_multimodel(work: Path, updates: int = 20, quiet_s: float = 8.0, rounds: int = 12,
                       block: int = 100) -> MultiReport:
    broker = start_mosquitto(work / "broker")
    home = EdgectlHome(work / "home", broker.url)
    home.path.mkdir()
    home.edgectl("keys", "init", check=True)
    controller = Controller(home, work / "controller")
    started: list[AgentProcess] = []
    try:
        def agent(device_id: str) -> AgentProcess:
            process = AgentProcess(device_id, work / device_id, broker.url, [home.public_key("package")],
                                   [home.public_key("controller")], extra={"deploy": FAST})
            started.append(process)
            return process.start()

        swaps = _swaps(controller, [agent("mm-a"), agent("mm-b")], work, updates, quiet_s)
        cost = _cost(controller, agent("mm-one"), agent("mm-four"), work, rounds, block)
        return MultiReport(updates=updates, rounds=rounds, **swaps, **cost)
    finally:
        for process in started:
            process.stop()
        controller.close()
        broker.stop()


def _package(controller: Controller, work: Path, name: str, version: int, seed: int) -> Package:
    return controller.package(tiny_classifier(work / f"{name}-{version}.onnx", seed=seed), name, version)


def _apply(controller: Controller, agents: list[AgentProcess], entries: list[tuple[Package, str]]) -> None:
    """Send each agent the set ``entries``; wait until every deployment in it has ended ok on every agent."""
    for a in agents:
        controller.desired_set(a.device_id, entries, allow_downgrade=True)
    for a in agents:
        for package, deployment in entries:
            wait_for(_waiter(controller, a.device_id, deployment, package.manifest.name), 300,
                     f"{a.device_id} to answer {deployment}")


def _waiter(controller: Controller, device_id: str, deployment: str, model: str) -> Callable[[], bool]:
    return lambda: _answered(controller, device_id, deployment, model)


def _answered(controller: Controller, device_id: str, deployment: str, model: str) -> bool:
    for e in list(controller.events):
        if e.device_id == device_id and e.deployment_id == deployment and e.model == model and e.status != "running":
            if e.status != "ok":
                raise RuntimeError(f"{device_id}: {model} ended {e.status}: {e.detail}")
            return True
    return False


def _swaps(controller: Controller, agents: list[AgentProcess], work: Path, updates: int, quiet_s: float) -> dict[str, Any]:
    steady, other = _package(controller, work, "steady", 1, 1), _package(controller, work, "other", 1, 2)
    moving = [_package(controller, work, "moving", v, 10 + v) for v in (1, 2, 3)]
    base = [(steady, "d-steady"), (other, "d-other")]
    _apply(controller, agents, [*base, (moving[0], "d-moving-0")])
    hammers = [Hammer(a, "steady") for a in agents]
    threads = [threading.Thread(target=h.run, daemon=True) for h in hammers]
    for t in threads:
        t.start()
    marks = {"before": time.monotonic()}
    time.sleep(quiet_s)
    marks["swaps"] = time.monotonic()
    for n in range(1, updates + 1):
        _apply(controller, agents, [*base, (moving[n % 3], f"d-moving-{n}")])
    marks["after"] = time.monotonic()
    time.sleep(quiet_s)
    marks["end"] = time.monotonic()
    for h in hammers:
        h.stop.set()
    for t in threads:
        t.join(timeout=30)
    phases = {"quiet (before and after)": [(marks["before"], marks["swaps"]), (marks["after"], marks["end"])],
              "during the swaps": [(marks["swaps"], marks["after"])]}
    picked = {phase: [s for h in hammers for s in h.samples if any(lo <= s[0] < hi for lo, hi in spans)]
              for phase, spans in phases.items()}
    ok = {phase: [s[1] * 1000 for s in samples if s[2]] for phase, samples in picked.items()}
    return {"swaps_s": marks["after"] - marks["swaps"], "requests": {p: len(s) for p, s in picked.items()},
            "failed": {p: sum(1 for x in s if not x[2]) for p, s in picked.items()},
            "p99_ms": {p: float(np.percentile(v, 99)) for p, v in ok.items()},
            "p50_ms": {p: float(np.percentile(v, 50)) for p, v in ok.items()}}


def _cost(controller: Controller, one: AgentProcess, four: AgentProcess, work: Path, rounds: int,
          block: int) -> dict[str, Any]:
    models = [_package(controller, work, f"m{i}", 1, 100 + i) for i in range(4)]
    _apply(controller, [one], [(models[0], "d-m0")])
    _apply(controller, [four], [(m, f"d-{m.manifest.name}") for m in models])
    time.sleep(3.0)  # idle: let the loads' garbage go and the telemetry settle
    rss = {label: psutil.Process(a.process.pid).memory_info().rss / 2**20 for label, a in  # type: ignore[union-attr]
           (("1 model", one), ("4 models", four))}
    footprints = _footprints(four, models)
    times: dict[str, list[float]] = {"1 model": [], "4 models": []}
    body, headers = _request(np.random.default_rng(1).random((1, 3, 32, 32), dtype=np.float32))
    connections = {label: http.client.HTTPConnection("127.0.0.1", a.http_port, timeout=30)
                   for label, a in (("1 model", one), ("4 models", four))}
    for _ in range(rounds):  # alternating blocks: the machine's load drifts alike for both
        for label, connection in connections.items():
            for _ in range(block):
                start = time.perf_counter()
                connection.request("POST", "/v2/models/m0/infer", body, headers)
                connection.getresponse().read()
                times[label].append((time.perf_counter() - start) * 1000)
    p50 = {label: statistics.median(values) for label, values in times.items()}
    return {"rss_mb": rss, "footprints_mb": footprints,
            "overhead": {**p50, "ratio": p50["4 models"] / p50["1 model"]}}


def _footprints(agent: AgentProcess, packages: list[Package]) -> dict[str, float]:
    """Each model's footprint as the agent measured it (its ``footprints.json``: what its state reports and its
    admission counts), the most any backend took."""
    book = json.loads((agent.state_dir / "footprints.json").read_text())["figures"]
    found = {}
    for package in packages:
        m = package.manifest
        figures = book.get(m.file(m.model).sha256[:16], {})
        if figures:
            found[m.name] = max(figures.values())
    return found


def multimodel_verdicts(report: MultiReport) -> list[str]:
    """The goals, PASS or FAIL, each with its figure."""
    failed = report.failed["during the swaps"] + report.failed["quiet (before and after)"]
    ratio = report.overhead["ratio"]
    return [
        f"- **{'PASS' if failed == 0 else 'FAIL'}** failed requests to the untouched model during {report.updates} updates "
        f"of another on two agents: {failed} of {sum(report.requests.values())} (goal 0)",
        f"- **{'PASS' if ratio <= OVERHEAD_GOAL else 'FAIL'}** p50 of the same request, four-model agent / one-model "
        f"agent: {ratio:.2f} (goal <= {OVERHEAD_GOAL})",
    ]


def multimodel_markdown(report: MultiReport, verdicts: list[str]) -> str:
    """The docs/benchmarks.md section body."""
    extra_rss = (report.rss_mb["4 models"] - report.rss_mb["1 model"]) / 3
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    lines = [f"{machine()}; load average (1/5/15 min) at the end: {load} (2 cores shared with other jobs).", "", *verdicts, "",
             f"### Swaps beside a served model ({report.updates} updates in {report.swaps_s:.1f} s, both agents)", "",
             "| phase | requests to `steady` | failed | p50 ms | p99 ms |", "|---|---|---|---|---|"]
    for phase in ("quiet (before and after)", "during the swaps"):
        lines.append(f"| {phase} | {report.requests[phase]} | {report.failed[phase]} | {report.p50_ms[phase]:.2f} | "
                     f"{report.p99_ms[phase]:.2f} |")
    lines += ["", "### What each more model costs (the same small classifier architecture, other weights)", "",
              "| agent | idle RSS MiB | p50 ms of `m0` |", "|---|---|---|"]
    lines += [f"| {label} | {report.rss_mb[label]:.1f} | {report.overhead[label]:.3f} |" for label in ("1 model", "4 models")]
    footprints = ", ".join(f"{name} {mb:.1f}" for name, mb in sorted(report.footprints_mb.items())) or "none reported"
    lines += ["", f"Idle memory per additional model: {extra_rss:.1f} MiB (RSS difference / 3). Footprints the "
              f"four-model agent measured at staging (MB, the most any backend took): {footprints}. Latency in "
              f"{report.rounds} alternating blocks of requests to the same model on either agent."]
    return "\n".join(lines)
