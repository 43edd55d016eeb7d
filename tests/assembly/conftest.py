"""The reference stack (``./scripts/stack up``), brought up once per module as an operator would, and what an operator sees of it.

Two stacks come up side by side, each through ``scripts/stack.py up`` in a directory of its own and
torn down with ``scripts/stack.py down --purge``: the HA stack of docs/fleet.md (PostgreSQL, two
``edgectl controller run --http`` replicas, a 3-node NATS cluster serving MQTT over TLS, the PKI,
the artifact origin, Prometheus on the shipped scrape config, one edge-agent and simulated devices),
and a smaller one on Mosquitto (``--broker mosquitto``), the other broker the docs offer. Sizes are
small and intervals short (telemetry and scrapes every second) so the module stays in minutes.

:class:`Stack` is the operator's side: ``edgectl`` with the stack's ``env`` exports, the REST API with
the stack's admin token, Prometheus' HTTP API, and the record ``stack.json`` (pids, ports, logs).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from edgectl.examples import tiny_classifier
from tests.checkout import REPO, checkout_env

__all__ = ["Stack", "settle"]

STACK = [sys.executable, str(REPO / "scripts" / "stack.py")]
TELEMETRY_S = 1.0
T = TypeVar("T")


@dataclass
class Stack:
    """One running reference stack, reached the way its operator reaches it."""

    dir: Path
    work: Path  # where the operator builds packages
    info: dict[str, Any]  # ``stack.py up --json``

    @property
    def record(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.dir / "stack.json").read_text())
        return data

    @property
    def api_urls(self) -> list[str]:
        return list(self.info["api_urls"])

    @property
    def devices(self) -> list[str]:
        return [*self.info["agents"], *self.info["sims"]]

    def pid(self, name: str) -> int:
        return int(self.record["procs"][name]["pid"])

    def env(self) -> dict[str, str]:
        """This process's environment plus what ``eval "$(./scripts/stack env --dir DIR)"`` exports."""
        done = subprocess.run([*STACK, "env", "--dir", str(self.dir)], capture_output=True, text=True, check=True, timeout=60)
        exports = {k: shlex.split(v)[0] for k, v in re.findall(r"^export (\w+)=(.+)$", done.stdout, re.M)}
        assert set(exports) >= {"EDGECTL_HOME", "EDGECTL_CONFIG"}, done.stdout
        return checkout_env(**exports)

    def edgectl(self, *args: str, check: bool = True, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([sys.executable, "-m", "edgectl.cli.main", *args], env=self.env(), cwd=self.work,
                              capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"edgectl {' '.join(args)} exited {done.returncode}:\n{done.stdout[-2000:]}\n"
                                 f"{done.stderr[-2000:]}")
        return done

    def api(self, path: str, method: str = "GET", url: str | None = None, body: dict[str, Any] | None = None) -> Any:
        """The REST API of ``url`` (default: the first replica) with the stack's admin token."""
        request = urllib.request.Request((url or self.api_urls[0]) + path, method=method,
                                         data=json.dumps(body).encode() if body is not None else None,
                                         headers={"Authorization": f"Bearer {self.info['admin_token']}",
                                                  "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def promql(self, expr: str) -> list[dict[str, Any]]:
        query = urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(f"{self.info['prometheus']}/api/v1/query?{query}", timeout=10) as response:
            answer: dict[str, Any] = json.loads(response.read())
        assert answer["status"] == "success", answer
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result

    def targets(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"{self.info['prometheus']}/api/v1/targets", timeout=10) as response:
            active: list[dict[str, Any]] = json.loads(response.read())["data"]["activeTargets"]
        return active

    def package(self, version: int) -> tuple[Path, str]:
        """A model built, signed and published to the stack's artifact origin by edgectl: (package, ``--artifact-url``)."""
        onnx = tiny_classifier(self.work / f"clf-{version}.onnx", seed=version)
        out = self.work / f"clf-{version}.edgepkg"
        self.edgectl("build", str(onnx), "--name", "clf", "--version", str(version), "--out", str(out))
        published = self.edgectl("artifacts", "publish", str(out), "--dir", self.info["artifacts_dir"],
                                 "--base-url", self.info["artifacts"]).stdout
        assert self.info["artifacts"] in published, published
        return out, self.info["artifacts"] + "/{artifact_id}"

    def rollout(self, rollout_id: str, url: str | None = None) -> dict[str, Any]:
        found: dict[str, Any] = self.api(f"/api/v1/rollouts/{rollout_id}", url=url)
        return found

    def logs(self) -> str:
        """The tail of every log, for a failure message."""
        parts = []
        for log in sorted((self.dir / "logs").glob("*.log")):
            parts.append(f"--- {log.name}\n" + log.read_text(errors="replace")[-1500:])
        return "\n".join(parts)


def settle(check: Callable[[], T], timeout: float, interval: float = 0.5) -> T:
    """``check()``'s value once it raises no AssertionError; its last AssertionError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return check()
        except AssertionError:
            if time.monotonic() > deadline:
                raise
        time.sleep(interval)


def _up(directory: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*STACK, "up", "--dir", str(directory), "--scrape-s", "1", "--telemetry-s", f"{TELEMETRY_S:g}",
                             "--json", *args], cwd=REPO, env=checkout_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _ready(directory: Path, process: subprocess.Popen[str]) -> Stack:
    try:
        out, err = process.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
    if process.returncode != 0:
        pytest.fail(f"./scripts/stack up --dir {directory} exited {process.returncode}: {err.strip()[-3000:]}")
    info: dict[str, Any] = json.loads(out)
    work = directory / "operator"
    work.mkdir()
    return Stack(directory, work, info)


def _down(directories: list[Path]) -> None:
    """``stack.py down --purge`` of each, side by side."""
    stopping = [subprocess.Popen([*STACK, "down", "--dir", str(d), "--purge"], cwd=REPO, env=checkout_env()) for d in directories]
    for process in stopping:
        process.wait(timeout=180)


@pytest.fixture(scope="module")
def stacks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, Stack]]:
    """The NATS stack (1 agent, 4 simulated devices) and the Mosquitto one (1 agent, 2), brought up side by side."""
    root = tmp_path_factory.mktemp("stacks")
    os.chmod(root, 0o755)  # the stack's PostgreSQL runs as the postgres user when the tests run as root
    nats_dir, mosquitto_dir = root / "nats", root / "mosquitto"
    started = {nats_dir: _up(nats_dir, "--agents", "1", "--sims", "4")}
    try:
        started[mosquitto_dir] = _up(mosquitto_dir, "--broker", "mosquitto", "--agents", "1", "--sims", "2")
        up = (_ready(nats_dir, started[nats_dir]), _ready(mosquitto_dir, started[mosquitto_dir]))
        yield up
    finally:
        for process in started.values():
            if process.poll() is None:  # `up` itself stops what it started when it fails, not when it is killed
                process.kill()
                process.communicate()
        _down(list(started))


@pytest.fixture(scope="module")
def stack(stacks: tuple[Stack, Stack]) -> Stack:
    """The HA stack: PostgreSQL, two replicas, 3-node NATS over TLS, Prometheus, 1 agent and 4 simulated devices."""
    return stacks[0]


@pytest.fixture(scope="module")
def mosquitto_stack(stacks: tuple[Stack, Stack]) -> Stack:
    return stacks[1]
