"""Chunked delivery over a real broker: duplicates, reordering, corruption, broker restarts, offline devices, full disks."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from edgecore.protocol import topics
from edgecore.protocol.chunks import read_chunk
from edgecore.protocol.reports import ChunkRequest
from edgectl.package import Package
from tests.brokers import BrokerProcess
from tests.deploy.controller import Controller
from tests.deploy.test_rejections import DEPLOY, serves
from tests.fleet import AgentProcess, EdgectlHome, wait_for

SMALL_CHUNKS = {"chunk_size": 4096}


def _publish_chunks(controller: Controller, package: Package, order: list[int]) -> None:
    m = package.manifest
    for index in order:
        data = read_chunk(package.payload, index, m.payload.chunk_size)
        controller.publish(topics.artifact_chunk(m.artifact_id, index), data)


def _asked(controller: Controller) -> list[list[list[int]]]:
    return [json.loads(r)["ranges"] for r in list(controller.requests)]


def _first_request(controller: Controller, since: int = 0) -> None:
    wait_for(lambda: len(controller.requests) > since, 20, "a chunk request")


def test_duplicated_reordered_and_corrupt_chunks(home: EdgectlHome, controller: Controller,
                                                 agents: Callable[..., AgentProcess], model_v: Callable[..., Path]) -> None:
    agent = agents(home, "d-1", extra={"deploy": DEPLOY})
    package = controller.package(model_v(1), "m", 1, **SMALL_CHUNKS)
    count = len(package.manifest.payload.chunks)
    assert count >= 4
    controller.serving = False
    deployment = controller.desired("d-1", package)
    _first_request(controller)
    artifact = package.manifest.artifact_id
    controller.publish(topics.artifact_chunk(artifact, 0), b"\x00" * 4096)  # fails its hash
    controller.publish(f"{topics.ROOT}/artifacts/{artifact}/chunks/x", b"{}")  # not a chunk topic
    order = list(range(count - 1, 0, -1))
    _publish_chunks(controller, package, order + order)  # reversed, then every one again
    asked = len(controller.requests)
    wait_for(lambda: [[0, 1]] in _asked(controller)[asked:], 20, "a request for exactly the dropped chunk")
    controller.serving = True
    controller.server.handle_request(ChunkRequest.from_payload(controller.requests[-1]))
    assert controller.final("d-1", deployment).status == "ok"
    assert serves(agent, "m", 1)
    log = agent.log_text()
    assert "dropped chunk 0" in log and "bad chunk index" in log


def test_broker_restart_mid_download(home: EdgectlHome, controller: Controller, mosquitto: BrokerProcess,
                                     agents: Callable[..., AgentProcess], model_v: Callable[..., Path]) -> None:
    agent = agents(home, "d-2", extra={"deploy": DEPLOY})
    package = controller.package(model_v(2), "m", 2, **SMALL_CHUNKS)
    count = len(package.manifest.payload.chunks)
    controller.serving = False
    deployment = controller.desired("d-2", package)
    _first_request(controller)
    _publish_chunks(controller, package, list(range(count // 2)))
    mosquitto.restart(down_for=1.0)
    wait_for(lambda: controller.transport.connected, 30, "controller reconnected")
    controller.serving = True
    assert controller.final("d-2", deployment, timeout=90).status == "ok"
    wait_for(lambda: serves(agent, "m", 2), 30, "v2 served")
    later = [r for ranges in _asked(controller) for r in ranges]
    assert all(start >= count // 2 for start, _ in later[-1:]), later  # the last ask skipped what had landed


def test_offline_agent_asks_for_what_it_missed(home: EdgectlHome, controller: Controller,
                                               agents: Callable[..., AgentProcess], model_v: Callable[..., Path]) -> None:
    agent = agents(home, "d-3", extra={"deploy": DEPLOY})
    assert controller.final("d-3", controller.desired("d-3", controller.package(model_v(1), "m", 1))).status == "ok"
    agent.stop()
    package = controller.package(model_v(2), "m", 2, **SMALL_CHUNKS)
    deployment = controller.desired("d-3", package)  # retained: waits on the broker
    _publish_chunks(controller, package, list(range(len(package.manifest.payload.chunks))))  # nobody listens
    since = len(controller.requests)
    agent.start()
    assert controller.final("d-3", deployment, timeout=90).status == "ok"
    assert len(controller.requests) > since
    wait_for(lambda: serves(agent, "m", 2), 30, "v2 served")


def test_disk_full_during_download(home: EdgectlHome, controller: Controller,
                                   agents: Callable[..., AgentProcess], model_v: Callable[..., Path]) -> None:
    package = controller.package(model_v(2, extra_matmuls=30), "m", 2, **SMALL_CHUNKS)
    v1 = controller.package(model_v(1), "m", 1)
    quota = package.manifest.payload.size // 2  # a disk that fills halfway through v2
    assert v1.manifest.payload.size < quota
    agent = agents(home, "d-4", extra={"deploy": {**DEPLOY, "download_quota_bytes": quota}})
    assert controller.final("d-4", controller.desired("d-4", v1)).status == "ok"
    final = controller.final("d-4", controller.desired("d-4", package))
    assert final.status == "failed" and "disk full" in final.detail, final.detail
    assert list((agent.state_dir / "downloads").iterdir()) == []
    assert serves(agent, "m", 1)
