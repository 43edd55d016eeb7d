"""A runtime that aborts on a model cannot take the agent down (issue 23, item 4).

A plain string model, deployed for a target that allows every backend: OpenVINO runs it, then
aborts (``free(): invalid pointer``) when its runner closes. Measured inside the agent's process
that ended the agent, and after the restart the deployment rolled back and nothing was served. Now
the candidates are measured in a child process: the agent stays up, serves the model on
onnxruntime, and its telemetry reports the crashed candidate with its signal.
"""

from __future__ import annotations

import json
import queue
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from edgecore.protocol import topics
from edgecore.transport import Message, MqttTransport
from tests.agent.test_selection_rules import string_echo
from tests.deploy.controller import Controller
from tests.deploy.test_rejections import DEPLOY
from tests.fleet import AgentProcess, EdgectlHome, wait_for


def _crashed_in_telemetry(inbox: queue.Queue[Message]) -> dict[str, Any] | None:
    """The serving selection's OpenVINO figure, once a telemetry report carries one."""
    while not inbox.empty():
        selection = json.loads(inbox.get().payload).get("selection") or {}
        figures = {f["backend"]: f for f in selection.get("figures", [])}
        if "openvino/CPU" in figures:
            return {**figures["openvino/CPU"], "serving": selection["backend"]}
    return None


@pytest.mark.timeout(300)
def test_an_aborting_backend_fails_its_candidate_and_the_agent_serves_on_the_others(
    tmp_path: Path, home: EdgectlHome, controller: Controller, agents: Callable[..., AgentProcess],
) -> None:
    pytest.importorskip("openvino", reason="OpenVINO is not installed: no candidate aborts")
    telemetry: queue.Queue[Message] = queue.Queue()
    listener = MqttTransport(home.broker_url, f"test-telemetry-{uuid.uuid4().hex[:8]}", inbox=telemetry)
    listener.subscribe(topics.device("x-1", "telemetry"), 0)
    listener.connect()
    try:
        agent = agents(home, "x-1", extra={"deploy": DEPLOY})
        package = controller.package(string_echo(tmp_path / "echo.onnx"), "echo", 1)  # target "any": every backend
        final = controller.final("x-1", controller.desired("x-1", package), timeout=240)
        assert final.status == "ok", final.detail + agent.log_text()[-3000:]
        assert final.data["backend"] == "onnxruntime/CPUExecutionProvider"
        assert agent.alive()
        answer = agent.http("/v2/models/echo/infer", json.dumps(
            {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": ["cat", "dog"]}]}).encode())
        assert answer["outputs"][0]["data"] == ["cat", "dog"]
        crashed = wait_for(lambda: _crashed_in_telemetry(telemetry), 30, "telemetry with the crashed candidate")
        assert crashed["serving"] == "onnxruntime/CPUExecutionProvider"
        assert (crashed["status"], crashed["signal"]) == ("failed", "SIGABRT"), crashed
        assert crashed["reason"].startswith("crashed (SIGABRT) while closing"), crashed
    finally:
        listener.close()
