"""A real agent fetching its artifact by HTTP Range: installs, fails over, refuses corrupt bytes, resumes, paces.

The in-process controller answers MQTT chunk requests only where a test says so: with
``controller.serving = False`` every byte the agent installs came over HTTP.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from edgectl.artifacts import RangeServer
from edgectl.artifacts.publish import export_payload
from edgectl.package import Package
from tests.deploy.controller import Controller
from tests.deploy.test_rejections import serves
from tests.fleet import AgentProcess, EdgectlHome, wait_for
from tests.http.conftest import DEPLOY, ServeProcess, desire, downloading


def _capped(rate: int) -> dict[str, object]:
    return {"deploy": {**DEPLOY, "http_max_bytes_per_s": rate}}


def test_installs_from_the_range_server(home: EdgectlHome, controller: Controller, agents: Callable[..., AgentProcess],
                                        big_package: Package, range_servers: Callable[..., RangeServer]) -> None:
    agent = agents(home, "h-1", extra={"deploy": DEPLOY})
    server = range_servers(big_package)
    controller.serving = False
    artifact = big_package.manifest.artifact_id
    deployment = desire(controller, "h-1", big_package, [server.url_of(artifact)])
    assert controller.final("h-1", deployment).status == "ok"
    assert serves(agent, "big", 1)
    assert server.bytes_sent == big_package.manifest.payload.size  # each byte once, none over MQTT
    assert controller.requests == []
    assert not (agent.state_dir / "downloads" / f"{artifact}.part").exists()


def test_a_url_that_does_not_answer_is_skipped(home: EdgectlHome, controller: Controller,
                                              agents: Callable[..., AgentProcess], big_package: Package,
                                              range_servers: Callable[..., RangeServer]) -> None:
    agents(home, "h-2", extra={"deploy": DEPLOY})
    server = range_servers(big_package)
    controller.serving = False
    artifact = big_package.manifest.artifact_id
    urls = ["http://127.0.0.1:9/nothing-listens-here", f"{server.url}/missing-{artifact}", server.url_of(artifact)]
    assert controller.final("h-2", desire(controller, "h-2", big_package, urls)).status == "ok"
    assert server.bytes_sent == big_package.manifest.payload.size


def test_server_dying_mid_download_the_next_url_goes_on(
        home: EdgectlHome, controller: Controller, agents: Callable[..., AgentProcess], big_package: Package,
        range_servers: Callable[..., RangeServer], serve_process: Callable[..., ServeProcess],
        tmp_path: Path) -> None:
    agent = agents(home, "h-3", extra={"deploy": DEPLOY})
    artifact, size = big_package.manifest.artifact_id, big_package.manifest.payload.size
    dying = serve_process(export_payload(big_package, tmp_path / "dying").parent, "--rate", "150000")
    backup = range_servers(big_package)
    controller.serving = False
    deployment = desire(controller, "h-3", big_package, [f"{dying.url}/{artifact}", backup.url_of(artifact)])
    downloading(agent.state_dir, big_package)
    time.sleep(1.5)  # a second and a half at 150 KB/s: about 200 of the 530 KB
    dying.kill()
    assert controller.final("h-3", deployment, timeout=120).status == "ok"
    assert serves(agent, "big", 1)
    assert 0 < backup.bytes_sent < size, "the second URL served only what the first had not"
    assert controller.requests == []


def test_server_dying_with_no_other_url_falls_back_to_mqtt(
        home: EdgectlHome, controller: Controller, agents: Callable[..., AgentProcess], big_package: Package,
        serve_process: Callable[..., ServeProcess], tmp_path: Path) -> None:
    agent = agents(home, "h-4", extra={"deploy": DEPLOY})
    artifact = big_package.manifest.artifact_id
    dying = serve_process(export_payload(big_package, tmp_path / "dying").parent, "--rate", "150000")
    deployment = desire(controller, "h-4", big_package, [f"{dying.url}/{artifact}"])
    downloading(agent.state_dir, big_package)
    time.sleep(1.5)
    dying.kill()
    assert controller.final("h-4", deployment, timeout=120).status == "ok"
    assert serves(agent, "big", 1)
    asked = controller.requests
    assert asked, "the rest came over MQTT"
    first = json.loads(asked[0])["ranges"]
    assert first[0][0] > 0, f"MQTT was asked only for what HTTP had not brought: {first}"
    assert "asking over MQTT" in agent.log_text()


def _corrupt_copy(package: Package, directory: Path, chunk: int) -> Path:
    """The payload with one byte flipped in ``chunk``: same size, wrong bytes."""
    out = export_payload(package, directory)
    data = bytearray(out.read_bytes())
    data[chunk * package.manifest.payload.chunk_size + 100] ^= 0xFF
    out.write_bytes(bytes(data))
    return out


def test_corrupt_bytes_are_refused_and_fetched_elsewhere(
        home: EdgectlHome, controller: Controller, agents: Callable[..., AgentProcess], big_package: Package,
        range_servers: Callable[..., RangeServer], tmp_path: Path) -> None:
    agent = agents(home, "h-5", extra={"deploy": DEPLOY})
    artifact, size = big_package.manifest.artifact_id, big_package.manifest.payload.size
    _corrupt_copy(big_package, tmp_path / "corrupt", chunk=3)
    corrupt = RangeServer(tmp_path / "corrupt").start()
    good = range_servers(big_package)
    try:
        controller.serving = False
        deployment = desire(controller, "h-5", big_package, [corrupt.url_of(artifact), good.url_of(artifact)])
        assert controller.final("h-5", deployment).status == "ok"
    finally:
        corrupt.stop()
    assert serves(agent, "big", 1)
    assert "chunk 3 does not match its signed sha256" in agent.log_text()
    chunk = big_package.manifest.payload.chunk_size
    assert good.bytes_sent == size - 3 * chunk, "chunks 0-2 came from the first URL, the rest from the second"


def test_corrupt_bytes_everywhere_then_mqtt(
        home: EdgectlHome, controller: Controller, agents: Callable[..., AgentProcess], big_package: Package,
        tmp_path: Path) -> None:
    agent = agents(home, "h-6", extra={"deploy": DEPLOY})
    artifact = big_package.manifest.artifact_id
    shutil.rmtree(tmp_path / "corrupt", ignore_errors=True)
    _corrupt_copy(big_package, tmp_path / "corrupt", chunk=0)
    corrupt = RangeServer(tmp_path / "corrupt").start()
    try:
        deployment = desire(controller, "h-6", big_package, [corrupt.url_of(artifact)])
        assert controller.final("h-6", deployment).status == "ok"
    finally:
        corrupt.stop()
    assert serves(agent, "big", 1)
    assert "chunk 0 does not match its signed sha256" in agent.log_text()
    assert controller.requests


def test_killed_agent_resumes_where_it_stopped(
        home: EdgectlHome, controller: Controller, agents: Callable[..., AgentProcess], big_package: Package,
        range_servers: Callable[..., RangeServer]) -> None:
    agent = agents(home, "h-7", extra={"deploy": DEPLOY})
    artifact, size = big_package.manifest.artifact_id, big_package.manifest.payload.size
    server = range_servers(big_package, rate=150_000)  # slow enough to kill the agent mid-body
    controller.serving = False
    deployment = desire(controller, "h-7", big_package, [server.url_of(artifact)])
    downloading(agent.state_dir, big_package)
    time.sleep(2.0)
    agent.kill()
    wait_for(lambda: len(server.served) >= 1, 10, "the server to notice the agent went away")
    before = len(server.served)
    first_run = sum(sent for _, sent in server.served)
    assert 0 < first_run < size, f"killed mid-download ({first_run} of {size} bytes sent)"
    agent.start()
    assert controller.final("h-7", deployment, timeout=120).status == "ok"
    assert serves(agent, "big", 1)
    second = server.served[before:]
    second_run = sum(sent for _, sent in second)
    assert second and second[0][0] > 0, f"the restarted agent asked from the first missing byte, not 0: {second}"
    assert second_run < size - 64 * 1024, f"resumed: {second_run} bytes the second time, the payload has {size}"


def test_bandwidth_cap_holds(home: EdgectlHome, controller: Controller, agents: Callable[..., AgentProcess],
                             big_package: Package, range_servers: Callable[..., RangeServer]) -> None:
    rate = 200_000
    agents(home, "h-8", extra=_capped(rate))
    artifact, size = big_package.manifest.artifact_id, big_package.manifest.payload.size
    server = range_servers(big_package)
    controller.serving = False
    deployment = desire(controller, "h-8", big_package, [server.url_of(artifact)])
    assert controller.final("h-8", deployment, timeout=120).status == "ok"
    events = {e.state: e.ts for e in controller.events if e.deployment_id == deployment}
    took = events["verify"] - events["download"]
    # A loose lower bound only: a capped device cannot be faster than the cap (minus one burst of slack).
    assert took >= 0.7 * size / rate, f"{size} bytes in {took:.2f}s with a cap of {rate} B/s"
