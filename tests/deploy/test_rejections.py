"""What a device must refuse before anything is loaded, while its old model keeps serving (TUF's attacks)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgecore import __version__
from edgecore.protocol import topics
from edgecore.protocol.envelope import COMMAND_TYPE, Envelope
from edgecore.protocol.manifest import TargetInfo
from edgecore.protocol.reports import DeviceEvent
from edgectl.package import Package
from tests.deploy.controller import Controller, resign_manifest
from tests.fleet import AgentProcess, EdgectlHome, wait_for

DEPLOY = {"request_interval_s": 0.5, "selection_budget_s": 0.3, "health_runs": 3, "download_deadline_s": 5}


def serves(agent: AgentProcess, name: str, version: int) -> bool:
    """The agent answers an inference request with model ``name`` at ``version``."""
    active = agent.active()
    if not active or (active["name"], active["version"]) != (name, version) or not agent.model_ready(name):
        return False
    x = np.zeros((1, 3, 8, 8), np.float32)
    body = {"inputs": [{"name": "image", "shape": [1, 3, 8, 8], "datatype": "FP32", "data": x.ravel().tolist()}]}
    answer = agent.http(f"/v2/models/{name}/infer", json.dumps(body).encode())
    return bool(answer["outputs"]) and bool(np.all(np.isfinite(answer["outputs"][0]["data"])))


def _flip_byte(controller: Controller, package: Package, tmp: Path) -> dict[str, Any]:
    """Serve the package's payload with one byte flipped: every device drops that chunk."""
    from edgectl.artifacts.chunk_server import ServedArtifact

    tampered = tmp / "tampered-payload.tar"
    data = bytearray(package.payload.read_bytes())
    data[len(data) // 2] ^= 0xFF
    tampered.write_bytes(bytes(data))
    m = package.manifest
    controller.server.serve(ServedArtifact(m.artifact_id, tampered, m.payload.chunk_size, len(m.payload.chunks)))
    return {}


def _fewer_bytes(controller: Controller, package: Package, _tmp: Path) -> dict[str, Any]:
    """A manifest (signed by the real key) that promises 100 bytes fewer than the payload has."""
    shrink = lambda m: dataclasses.replace(m, payload=dataclasses.replace(m.payload, size=m.payload.size - 100))  # noqa: E731
    return {"manifest": resign_manifest(package, controller.ring.signing_key("package"), shrink)}


def _newer_agent(controller: Controller, package: Package, _tmp: Path) -> dict[str, Any]:
    """A manifest (signed by the real key) for agents newer than this one."""
    needs = lambda m: dataclasses.replace(m, min_agent_version=NEWER_AGENT)  # noqa: E731
    return {"manifest": resign_manifest(package, controller.ring.signing_key("package"), needs)}


# The next minor version after this agent's: 0.9.x -> 0.10.0 compares as a number, not as text.
NEWER_AGENT = f"{__version__.split('.')[0]}.{int(__version__.split('.')[1]) + 1}.0"
Craft = Callable[[Controller, Package, Path], dict[str, Any]]
# case -> (build options of the package, how the desired state is crafted from it)
CASES: dict[str, tuple[dict[str, Any], Craft]] = {
    "flipped byte in the model": ({}, _flip_byte),
    "tampered and re-signed with an untrusted key": ({}, lambda c, p, t: {
        "manifest": resign_manifest(p, Ed25519PrivateKey.generate())}),
    "missing signature": ({}, lambda c, p, t: {"manifest": Envelope(p.envelope.payload_type, p.envelope.payload, ())}),
    "changed payload type": ({}, lambda c, p, t: {
        "manifest": Envelope(COMMAND_TYPE, p.envelope.payload, p.envelope.signatures)}),
    "manifest promises fewer bytes than sent": ({}, _fewer_bytes),
    "expired manifest": ({"valid_days": -1}, lambda c, p, t: {}),
    "package for another target": ({"target": TargetInfo("jetson-orin")}, lambda c, p, t: {}),
    "older version replayed": ({"version": 1}, lambda c, p, t: {}),
    "needs a newer agent": ({}, _newer_agent),
}
# The one-line reason a case must report, where the matrix checks it word for word.
REASONS = {"needs a newer agent": f"m v3 needs agent {NEWER_AGENT} or newer; this agent is {__version__}"}


def test_rejection_matrix(tmp_path: Path, home: EdgectlHome, controller: Controller,
                          agents: Callable[..., AgentProcess], model_v: Callable[..., Path]) -> None:
    agent = agents(home, "cam-1", target="cam-x86", extra={"deploy": DEPLOY})
    v2 = controller.package(model_v(2), "m", 2)
    controller.final("cam-1", controller.desired("cam-1", v2))
    wait_for(lambda: serves(agent, "m", 2), 30, "v2 served")
    for n, (case, (options, craft)) in enumerate(CASES.items()):
        options = dict(options)
        package = controller.package(model_v(10 + n), "m", options.pop("version", 3), **options)
        event = _check_rejected(case, controller, agent, package, craft(controller, package, tmp_path))
        assert case not in REASONS or (event.status, event.detail) == ("failed", REASONS[case]), f"{case}: {event.detail}"

    # The replay still fails after a restart: the accepted version is persisted.
    agent.stop()
    agent.start()
    wait_for(lambda: serves(agent, "m", 2), 30, "v2 served after restart")
    _check_rejected("older version after restart", controller, agent, controller.package(model_v(1), "m", 1), {})


def _check_rejected(case: str, controller: Controller, agent: AgentProcess, package: Package,
                    kwargs: dict[str, Any]) -> DeviceEvent:
    since = len(controller.events)
    deployment = controller.desired("cam-1", package, **kwargs)
    event = controller.rejection("cam-1", since, timeout=30)
    states = [s for s, _ in controller.history("cam-1", deployment)]
    assert not {"stage", "activate", "health", "commit"} & set(states), f"{case}: reached {states}"
    assert serves(agent, "m", 2), f"{case}: the old model stopped serving"
    assert agent.alive(), f"{case}: agent died"
    print(f"{case}: {event.state}/{event.status}: {event.detail}")
    return event


@pytest.mark.parametrize("leaf", ["desired", "commands"])
def test_malformed_messages_are_logged_and_ignored(home: EdgectlHome, controller: Controller, leaf: str,
                                                   agents: Callable[..., AgentProcess], model_v: Callable[..., Path]) -> None:
    agent = agents(home, "cam-2", extra={"deploy": DEPLOY})
    v1 = controller.package(model_v(1), "m", 1)
    controller.final("cam-2", controller.desired("cam-2", v1))
    topic = topics.device("cam-2", leaf)
    bad = {
        b"{not json": "not JSON",
        json.dumps({"schema": 99, "payloadType": "x", "payload": "", "signatures": []}).encode(): "",
        b"\xff\xfe\x00": "not JSON",
    }
    for payload in bad:
        controller.publish(topic, payload)
    # A wrong schema inside a correctly signed envelope.
    from edgecore.protocol.envelope import DESIRED_TYPE, sign

    kind = DESIRED_TYPE if leaf == "desired" else COMMAND_TYPE
    inner = json.dumps({"schema": 99, "type": leaf.rstrip("s")}).encode()  # a schema no agent speaks
    controller.publish(topic, sign(kind, inner, controller.ring.signing_key("controller")).to_bytes())
    # (Bad chunks and chunk topics need a download in progress: see test_delivery.py.)
    wait_for(lambda: agent.log_text().count("rejected message on") >= 4, 20, "rejections logged")
    log = agent.log_text()
    assert "unsupported schema version" in log and "not JSON" in log
    assert agent.alive() and serves(agent, "m", 1)
