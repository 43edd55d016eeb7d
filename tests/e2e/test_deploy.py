"""End to end: real broker, real agent processes, edgectl as a user runs it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort

from edgectl.examples import tiny_classifier
from tests.brokers import BrokerProcess
from tests.fleet import AgentProcess, EdgectlHome, wait_for


def _infer(agent: AgentProcess, model: str, x: np.ndarray) -> np.ndarray:
    body = {"inputs": [{"name": "image", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    answer = agent.http(f"/v2/models/{model}/infer", json.dumps(body).encode())
    out = answer["outputs"][0]
    return np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])


def test_deploy_to_two_agents_answers_like_onnxruntime(
    tmp_path: Path, any_broker: BrokerProcess, home_for: Callable[..., EdgectlHome], agents: Callable[..., AgentProcess]
) -> None:
    home = home_for(tmp_path, any_broker)
    a, b = agents(home, "cam-1"), agents(home, "cam-2")
    model = tiny_classifier(tmp_path / "classifier.onnx", seed=3)

    result = home.edgectl("deploy", str(model), "--device", "cam-1", "--device", "cam-2",
                          "--name", "classifier", "--version", "1", "--json", "--timeout", "120")
    assert result.returncode == 0, result.stdout + result.stderr
    outcome = json.loads(result.stdout)
    assert {d["device_id"]: d["status"] for d in outcome["devices"]} == {"cam-1": "ok", "cam-2": "ok"}

    x = np.random.default_rng(7).standard_normal((1, 3, 32, 32)).astype(np.float32)
    expected = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"image": x})[0]
    for agent in (a, b):
        assert agent.active_version() == 1
        np.testing.assert_allclose(_infer(agent, "classifier", x), expected, rtol=1e-4, atol=1e-5)

    listing = json.loads(home.edgectl("devices", "--json", check=True).stdout)
    by_id = {d["device_id"]: d for d in listing}
    assert by_id["cam-1"]["status"] == "online" and by_id["cam-1"]["model"] == "classifier"
    assert by_id["cam-2"]["version"] == 1


def test_restart_keeps_active_model(
    tmp_path: Path, mosquitto: BrokerProcess, home_for: Callable[..., EdgectlHome], agents: Callable[..., AgentProcess]
) -> None:
    home = home_for(tmp_path, mosquitto)
    agent = agents(home, "edge-7")
    model = tiny_classifier(tmp_path / "m.onnx", seed=4)
    home.edgectl("deploy", str(model), "-d", "edge-7", "--name", "m", "--version", "2", check=True)
    agent.stop()
    agent.start()
    wait_for(lambda: agent.model_ready("m"), 30, "model served after restart")
    x = np.zeros((1, 3, 32, 32), np.float32)
    expected = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"image": x})[0]
    np.testing.assert_allclose(_infer(agent, "m", x), expected, rtol=1e-4, atol=1e-5)
