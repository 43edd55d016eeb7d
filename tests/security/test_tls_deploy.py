"""The whole deploy flow over TLS: fleet PKI, the generated Mosquitto config, an enrolled agent, edgectl as controller."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import yaml

from edgectl.examples import tiny_classifier
from edgectl.pki import enroll_device
from edgectl.pki.bundle import BundleTrust
from tests.brokers import free_port
from tests.fleet import AgentProcess, EdgectlHome
from tests.security.conftest import Fleet, make_fleet

DEVICE = "cam-tls"


class BundleAgent(AgentProcess):
    """An agent that runs from the agent.yaml of its enrollment bundle, plus what a test host needs."""

    def write_config(self) -> Path:
        path = self.workdir / "agent.yaml"
        config = yaml.safe_load(path.read_text())
        assert config["broker"].startswith("mqtts://") and set(config["tls"]) == {"ca", "cert", "key"}
        self.http_port = self.http_port or free_port()
        config.update(state_dir=str(self.state_dir), inference={"port": self.http_port}, telemetry_interval_s=1.0,
                      deploy={"request_interval_s": 1.0, "selection_budget_s": 0.5, "health_runs": 5})
        path.write_text(yaml.safe_dump(config))
        return path


@pytest.fixture
def tls_fleet(tmp_path: Path) -> Iterator[tuple[Fleet, EdgectlHome]]:
    fleet = make_fleet(tmp_path / "fleet")
    url = f"mqtts://localhost:{fleet.port}"
    home = EdgectlHome(tmp_path / "home", url)
    home.path.mkdir()
    home.edgectl("keys", "init", check=True)
    trust = BundleTrust([home.public_key("package")], [home.public_key("controller")])
    enroll_device(fleet.pki, DEVICE, fleet.root / "bundles" / DEVICE, url, {"site": "lab"}, 30, trust)
    fleet.start_broker()
    yield fleet, home
    assert fleet.broker is not None
    fleet.broker.stop()


def test_deploy_over_tls_with_enrolled_agent_and_controller_identity(tmp_path: Path,
                                                                      tls_fleet: tuple[Fleet, EdgectlHome]) -> None:
    fleet, home = tls_fleet
    controller = fleet.controller
    config = tmp_path / "edgectl.yaml"
    config.write_text(yaml.safe_dump({"broker": home.broker_url, "tls": {
        "ca": str(controller.ca), "cert": str(controller.cert), "key": str(controller.key)}}))
    agent = BundleAgent(DEVICE, fleet.root / "bundles" / DEVICE, home.broker_url, [], [])
    agent.start()
    try:
        model = tiny_classifier(tmp_path / "classifier.onnx", seed=11)
        result = home.edgectl("--config", str(config), "deploy", str(model), "-d", DEVICE, "--name", "classifier",
                              "--version", "1", "--json", "--timeout", "90")
        assert result.returncode == 0, result.stdout + result.stderr
        assert [d["status"] for d in json.loads(result.stdout)["devices"]] == ["ok"]
        assert agent.active_version() == 1 and agent.model_ready("classifier")

        x = np.random.default_rng(1).standard_normal((1, 3, 32, 32)).astype(np.float32)
        body = {"inputs": [{"name": "image", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
        out = agent.http("/v2/models/classifier/infer", json.dumps(body).encode())["outputs"][0]
        expected = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"image": x})[0]
        np.testing.assert_allclose(np.asarray(out["data"], np.float32).reshape(out["shape"]), expected, rtol=1e-4, atol=1e-5)

        devices = json.loads(home.edgectl("--config", str(config), "devices", "--json", check=True).stdout)
        assert [(d["device_id"], d["status"], d["version"]) for d in devices] == [(DEVICE, "online", 1)]
    finally:
        agent.stop()

    # Without a client certificate the same broker refuses edgectl (exit 4: broker unavailable).
    anonymous = tmp_path / "no-cert.yaml"
    anonymous.write_text(yaml.safe_dump({"broker": home.broker_url, "tls": {"ca": str(controller.ca)}}))
    refused = home.edgectl("--config", str(anonymous), "devices", "--json")
    assert refused.returncode == 4, refused.stdout + refused.stderr
