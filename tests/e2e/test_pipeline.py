"""End to end: a pipeline (a detector whose box feeds a classifier through an ONNX crop-and-resize graph) built with
`edgectl pipeline build`, deployed with its models by `edgectl deploy --device`, served under its own name beside
them, answering exactly as its steps run by hand; /v2/models and the repository index list all three."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import yaml

from edgecore.protocol.manifest import TargetInfo
from edgectl.examples import tiny_classifier
from edgectl.keys import Keyring
from edgectl.package import BuildOptions, build_package
from tests.brokers import BrokerProcess
from tests.deploy.models import crop_resize_graph, tiny_detector
from tests.fleet import AgentProcess, EdgectlHome

# Every step on onnxruntime's CPU, the device's and the hand run's alike: the answers must be the same numbers.
CPU_ONLY = TargetInfo("any", ("CPUExecutionProvider",))
STEPS = [
    {"name": "detect", "model": "det", "inputs": {"image": "image"}, "outputs": {"boxes": "boxes"}},
    {"name": "crop", "graph": "crop.onnx", "inputs": {"image": "image", "boxes": "boxes"}, "outputs": {"patch": "patch"}},
    {"name": "classify", "model": "cls", "inputs": {"image": "patch"}, "outputs": {"probabilities": "scores"}},
]


def pipeline_files(folder: Path, home: EdgectlHome, version: int = 1, seed: int = 0) -> tuple[Path, Path, Path]:
    """The detector and classifier packages (``seed`` picks their weights), the crop graph and the pipeline's YAML;
    returns the models' ONNX files and the YAML."""
    det = tiny_detector(folder / f"det-{seed}.onnx", seed=seed + 1)
    cls = tiny_classifier(folder / f"cls-{seed}.onnx", size=16, seed=seed + 2)
    crop_resize_graph(folder / "crop.onnx")
    key = Keyring(home.path / "keys").signing_key("package")
    for name, model in (("det", det), ("cls", cls)):
        build_package(model, BuildOptions(name, version, CPU_ONLY), key, folder / f"{name}-{version}.edgepkg")
    spec = folder / "plates.yaml"
    spec.write_text(yaml.safe_dump({"name": "plates", "models": {"det": f"det-{version}.edgepkg",
                                                                  "cls": f"cls-{version}.edgepkg"},
                                    "outputs": ["boxes", "scores"], "steps": STEPS}))
    return det, cls, spec


def by_hand(det: Path, crop: Path, cls: Path, image: np.ndarray) -> dict[str, np.ndarray]:
    """The pipeline's steps run one after the other with onnxruntime, as a user would without the device."""
    def run(model: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
        answer: np.ndarray = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
        return answer

    boxes = run(det, {"image": image})
    patch = run(crop, {"image": image, "boxes": boxes})
    return {"boxes": boxes, "scores": run(cls, {"image": patch})}


def infer(agent: AgentProcess, name: str, image: np.ndarray) -> dict[str, np.ndarray]:
    body = {"inputs": [{"name": "image", "shape": list(image.shape), "datatype": "FP32", "data": image.ravel().tolist()}]}
    answer = agent.http(f"/v2/models/{name}/infer", json.dumps(body).encode())
    return {o["name"]: np.asarray(o["data"], np.float32).reshape(o["shape"]) for o in answer["outputs"]}


def post(agent: AgentProcess, path: str) -> Any:
    request = urllib.request.Request(f"http://127.0.0.1:{agent.http_port}{path}", data=b"{}", method="POST")
    with urllib.request.urlopen(request, timeout=30) as r:
        return json.loads(r.read())


def test_a_pipeline_is_served_under_its_own_name_and_answers_as_its_steps_by_hand(
        tmp_path: Path, mosquitto: BrokerProcess, home_for: Callable[..., EdgectlHome],
        agents: Callable[..., AgentProcess]) -> None:
    home = home_for(tmp_path, mosquitto)
    agent = agents(home, "cam-1")
    det, cls, spec = pipeline_files(tmp_path, home)
    built = home.edgectl("pipeline", "build", str(spec), "--version", "1", "-o", str(tmp_path / "plates-1.edgepkg"),
                         "--json", check=True)
    manifest = json.loads(built.stdout)
    assert manifest["kind"] == "pipeline" and [s["name"] for s in manifest["pipeline"]["steps"]] == ["detect", "crop",
                                                                                                     "classify"]
    packages = [str(tmp_path / f) for f in ("det-1.edgepkg", "cls-1.edgepkg", "plates-1.edgepkg")]
    result = home.edgectl("deploy", *packages, "--device", "cam-1", "--json", "--timeout", "240")
    assert result.returncode == 0, result.stdout + result.stderr
    [device] = json.loads(result.stdout)["devices"]
    assert device["status"] == "ok" and device["models"] == {"det": "ok", "cls": "ok", "plates": "ok"}, device

    image = np.random.default_rng(5).random((1, 3, 32, 32), dtype=np.float32)
    served, expected = infer(agent, "plates", image), by_hand(det, tmp_path / "crop.onnx", cls, image)
    assert sorted(served) == ["boxes", "scores"]
    for name in expected:
        np.testing.assert_allclose(served[name], expected[name], rtol=1e-5, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(infer(agent, "det", image)["boxes"], expected["boxes"], rtol=1e-5, atol=1e-6)

    listed = agent.http("/v2/models")["models"]
    assert [(m["name"], m["kind"], m["state"]) for m in listed] == [("cls", "model", "READY"), ("det", "model", "READY"),
                                                                     ("plates", "pipeline", "READY")]
    assert [(m["name"], m["version"]) for m in post(agent, "/v2/repository/index")] == [("cls", "1"), ("det", "1"),
                                                                                          ("plates", "1")]
    metadata = agent.http("/v2/models/plates")
    assert [t["name"] for t in metadata["inputs"]] == ["image"] and [t["name"] for t in metadata["outputs"]] == ["boxes",
                                                                                                               "scores"]
    assert agent.http("/v2/models/det")["outputs"][0]["shape"] == [1, 4]
