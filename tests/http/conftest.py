"""Fixtures for artifacts over HTTP(S): the deploy fixtures (broker, home, controller), Range servers, big packages."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from edgecore.protocol import topics
from edgecore.protocol.envelope import DESIRED_TYPE, sign
from edgecore.protocol.messages import DesiredModel, DesiredState
from edgectl.artifacts import RangeServer
from edgectl.artifacts.publish import export_payload
from edgectl.examples import tiny_classifier
from edgectl.package import Package
from tests.checkout import checkout_env
from tests.deploy.conftest import controller, home, model_v  # noqa: F401  (fixtures used here)
from tests.deploy.controller import Controller
from tests.fleet import wait_for

# Fast deploy settings; the deadline leaves room for capped downloads and a loaded machine.
DEPLOY = {"request_interval_s": 0.5, "selection_budget_s": 0.3, "health_runs": 3, "download_deadline_s": 120}


def desire(ctl: Controller, device_id: str, package: Package, urls: list[str]) -> str:
    """Publish a signed desired state for ``package`` that names ``urls``; returns the deployment id."""
    deployment_id = f"d-{uuid.uuid4().hex[:10]}"
    m = package.manifest
    now = time.time()
    state = DesiredState(device_id, ctl.next_seq(), now, now + 3600, deployment_id,
                         DesiredModel(m.name, m.version, package.envelope, tuple(urls)), {})
    envelope = sign(DESIRED_TYPE, state.to_payload(), ctl.ring.signing_key("controller"))
    ctl.publish(topics.device(device_id, "desired"), envelope.to_bytes(), retain=True)
    return deployment_id


@pytest.fixture
def big_package(controller: Controller, tmp_path: Path) -> Package:  # noqa: F811
    """A package of about 530 KB in 16 KiB chunks: slow enough under a rate cap to be interrupted."""
    model = tiny_classifier(tmp_path / "big.onnx", size=8, seed=7, extra_matmuls=128)
    package = controller.package(model, "big", 1, chunk_size=16384)
    assert package.manifest.payload.size > 500_000
    return package


@pytest.fixture
def range_servers(tmp_path: Path) -> Iterator[Callable[..., RangeServer]]:
    """Factory: range_servers(package, rate=None) serves the payload from its own directory, in this process."""
    started: list[RangeServer] = []

    def start(package: Package, rate: int | None = None) -> RangeServer:
        root = tmp_path / f"served-{len(started)}"
        export_payload(package, root)
        server = RangeServer(root, rate=rate).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@dataclass
class ServeProcess:
    """``edgectl artifacts serve DIR --port 0`` in its own process."""

    process: subprocess.Popen[str]
    url: str

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)


@pytest.fixture
def serve_process(tmp_path: Path) -> Iterator[Callable[..., ServeProcess]]:
    started: list[ServeProcess] = []

    def start(directory: Path, *args: str) -> ServeProcess:
        process = subprocess.Popen([sys.executable, "-m", "edgectl.cli.main", "artifacts", "serve", str(directory),
                                    "--port", "0", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   env=checkout_env(PYTHONUNBUFFERED="1"))
        assert process.stdout is not None
        line = process.stdout.readline()
        match = re.search(r"on (http://\S+?)/?$", line.strip())
        assert match, f"edgectl artifacts serve printed {line!r}"
        served = ServeProcess(process, match[1])
        started.append(served)
        return served

    yield start
    for served in started:
        if served.process.poll() is None:
            served.process.terminate()
            served.process.wait(10)


def part_file(state_dir: Path, package: Package) -> Path:
    return state_dir / "downloads" / f"{package.manifest.artifact_id}.part"


def downloading(state_dir: Path, package: Package) -> None:
    wait_for(lambda: part_file(state_dir, package).exists(), 60, "the download to start")
