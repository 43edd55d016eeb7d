"""The lean agent (``edgectl[agent]``: no onnx, no OpenVINO) runs the daemon, stages, serves and probes."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from edgectl.examples import tiny_classifier
from tests.brokers import BrokerProcess
from tests.checkout import checkout_env
from tests.devices.lean import declared, lean_venv, requirement_closure
from tests.fleet import AgentProcess, EdgectlHome


@pytest.fixture(scope="module")
def lean_python(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield lean_venv(tmp_path_factory.mktemp("lean") / "venv")


def test_the_agent_extra_leaves_out_the_host_libraries() -> None:
    names = set(requirement_closure(declared("agent")))
    assert {"onnxruntime", "numpy", "paho-mqtt", "protobuf"} <= names
    assert not names & {"onnx", "openvino", "onnxscript", "scikit-learn", "amqtt"}, names


def test_the_lean_venv_has_no_onnx_nor_openvino(lean_python: Path) -> None:
    probe = "import importlib.util as u; print([m for m in ('onnx', 'openvino', 'onnxruntime') if u.find_spec(m)])"
    found = subprocess.run([str(lean_python), "-c", probe], capture_output=True, text=True, check=True).stdout
    assert found.strip() == "['onnxruntime']"


def test_lean_agent_takes_a_deployment_and_answers_like_onnxruntime(
    tmp_path: Path, mosquitto: BrokerProcess, home_for: Callable[..., EdgectlHome], lean_python: Path,
) -> None:
    home = home_for(tmp_path, mosquitto)
    agent = AgentProcess("lean-1", tmp_path / "lean-1", home.broker_url, [home.public_key("package")],
                         [home.public_key("controller")], python=str(lean_python)).start()
    try:
        model = tiny_classifier(tmp_path / "classifier.onnx", seed=5)
        result = home.edgectl("deploy", str(model), "--device", "lean-1", "--name", "classifier", "--version", "1",
                              "--json", "--timeout", "120")
        assert result.returncode == 0, result.stdout + result.stderr + agent.log_text()[-3000:]
        x = np.random.default_rng(3).standard_normal((1, 3, 32, 32)).astype(np.float32)
        body = {"inputs": [{"name": "image", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
        out = agent.http("/v2/models/classifier/infer", json.dumps(body).encode())["outputs"][0]
        got = np.asarray(out["data"], np.float32).reshape(out["shape"])
        expected = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"image": x})[0]
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
        assert "No module named" not in agent.log_text()
    finally:
        agent.stop()


def test_lean_probe_benchmarks_a_model(tmp_path: Path, lean_python: Path) -> None:
    model = tiny_classifier(tmp_path / "classifier.onnx", seed=6)
    (tmp_path / "golden").mkdir()
    np.save(tmp_path / "golden" / "sample.npy", np.random.default_rng(2).random((1, 3, 32, 32), np.float32))
    proc = subprocess.run([str(lean_python), "-m", "agent.cli.main", "probe", "--json", "--model", str(model),
                           "--budget", "0.3", "--golden", str(tmp_path / "golden")],
                          capture_output=True, text=True, env=checkout_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert "openvino" not in report["runtimes"] and "onnxruntime" in report["runtimes"]
    assert report["selection"]["backend"].startswith("onnxruntime/")


@pytest.mark.parametrize("command", [["targets", "list"], ["quantize", "m.onnx", "--target", "cpu-x86", "-o", "q.onnx"],
                                     ["build", "m.onnx", "--name", "m", "--version", "1"]], ids=" ".join)
def test_edgectl_without_the_host_extra_says_which_extra_to_install(lean_python: Path, tmp_path: Path,
                                                                    command: list[str]) -> None:
    """Whether the command's module or the command as it runs imports a workstation module first."""
    tiny_classifier(tmp_path / "m.onnx", seed=7)
    env = checkout_env(EDGECTL_HOME=str(tmp_path / "home"))
    subprocess.run([str(lean_python), "-m", "edgectl.cli.main", "keys", "init"], cwd=tmp_path, env=env, check=True,
                   capture_output=True, timeout=120)  # build needs a signing key before it reads the model
    proc = subprocess.run([str(lean_python), "-m", "edgectl.cli.main", *command], cwd=tmp_path,
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: edgectl needs the workstation tools (onnx, openvino, nncf, jwt not installed): pip install 'edgectl[host]'"]
