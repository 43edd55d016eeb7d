"""Each profile's runtime, honestly: what a device's runtimes can run, and what to install for the rest."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openvino
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from agent.hardware.runtimes import Installed, profile_dirs, profile_needs, profile_statuses
from edgecore.errors import ConfigError
from edgecore.protocol import topics
from edgecore.protocol.package import sha256_file
from edgecore.protocol.reports import Birth
from edgecore.runtimes import read_profile_needs, version_matches
from edgectl.examples import tiny_classifier
from targets import list_profiles, load_profile_file
from targets.profile import BUILTIN_DIR
from tests.brokers import BrokerProcess
from tests.checkout import checkout_env
from tests.fleet import AgentProcess, EdgectlHome

CPU = "CPUExecutionProvider"


@pytest.mark.parametrize(("version", "spec", "inside"), [
    ("2022.3.1", ">=2021.4,<2023.0", True),
    ("2022.3.0-9052-9752fafe8eb-releases/2022/3", ">=2021.4,<2023.0", True),
    ("2023.0.0", ">=2021.4,<2023.0", False),
    ("2022.3.1", ">=2021.4,<=2022.3", False),  # why the Myriad range says <2023.0
    ("1.16.3", ">=1.10,<1.17", True),
    ("1.17", ">=1.10,<1.17", False),
    ("1.32.0", ">=1.16", True),
    ("1.20", "==1.20.0", True),
])
def test_versions_compare_as_numbers(version: str, spec: str, inside: bool) -> None:
    assert version_matches(version, spec) is inside


def _status(installed: Installed) -> dict[str, dict[str, Any]]:
    return {s.profile: s.to_dict() for s in profile_statuses(installed, profile_needs([BUILTIN_DIR]))}


def test_a_jetson_with_the_jetpack_onnxruntime_runs_its_profiles_and_not_the_others() -> None:
    jetson = Installed({"onnxruntime": "1.16.3"},
                       {"onnxruntime": ["TensorrtExecutionProvider", "CUDAExecutionProvider", CPU]})
    status = _status(jetson)
    assert status["jetson-orin"] == {"status": "ready"} and status["jetson-nano"] == {"status": "ready"}
    assert status["cpu-arm"] == {"status": "ready"}
    assert status["myriad"]["status"] == "missing"
    assert status["myriad"]["problems"] == ["OpenVINOExecutionProvider: openvino is not installed"]
    assert "2022.3 LTS" in str(status["myriad"]["install"])
    assert status["nnapi"]["status"] == "missing" and "onnxruntime-android" in str(status["nnapi"]["install"])
    assert status["edgetpu"]["status"] == "unsupported"


def test_the_pypi_onnxruntime_cannot_run_tensorrt_and_says_what_to_install() -> None:
    status = _status(Installed({"onnxruntime": "1.32.0"}, {"onnxruntime": [CPU]}))["jetson-orin"]
    assert status["status"] == "missing"
    assert status["problems"] == ["TensorrtExecutionProvider: this onnxruntime 1.32.0 build has no TensorrtExecutionProvider",
                                  "CUDAExecutionProvider: this onnxruntime 1.32.0 build has no CUDAExecutionProvider"]
    assert len(status["install"]) == 1 and "JetPack" in str(status["install"])


def test_cuda_without_tensorrt_is_partial() -> None:
    cuda = Installed({"onnxruntime": "1.18.0"}, {"onnxruntime": ["CUDAExecutionProvider", CPU]})
    assert _status(cuda)["jetson-orin"]["status"] == "partial"


def test_myriad_needs_the_lts_openvino_with_its_plugin() -> None:
    lts = Installed({"onnxruntime": "1.16.3", "openvino": "2022.3.1"},
                    {"onnxruntime": [CPU], "openvino": ["CPU", "GPU", "MYRIAD"]})
    status = _status(lts)
    assert status["myriad"] == {"status": "ready"}
    assert status["intel-npu"]["problems"] == ["OpenVINOExecutionProvider: openvino 2022.3.1 is outside >=2024.0"]
    no_plugin = Installed({"onnxruntime": "1.16.3", "openvino": "2022.3.1"}, {"onnxruntime": [CPU], "openvino": ["CPU"]})
    assert _status(no_plugin)["myriad"]["problems"] == ["OpenVINOExecutionProvider: openvino 2022.3.1 has no MYRIAD plugin"]


def test_a_profile_whose_cpu_runtime_is_too_old_is_missing() -> None:
    old = Installed({"onnxruntime": "1.14.1"}, {"onnxruntime": [CPU]})
    assert _status(old)["cpu-x86"]["problems"] == ["CPUExecutionProvider: onnxruntime 1.14.1 is outside >=1.16"]


def test_host_and_device_read_the_same_runtime_needs() -> None:
    for profile in list_profiles():
        if profile.source_file.parent != BUILTIN_DIR:
            continue
        needs = read_profile_needs(profile.source_file)
        assert needs.needs == tuple(ep.need() for ep in profile.execution_providers), profile.name
        assert (needs.unsupported is None) == (profile.unsupported is None)


@pytest.mark.parametrize(("key", "value", "problem"), [
    ("versions", "'~=1.16'", "is not a bound"),
    ("install", "''", "must be a non-empty string"),
])
def test_a_bad_runtime_key_is_one_line_naming_file_and_key(tmp_path: Path, key: str, value: str, problem: str) -> None:
    text = (BUILTIN_DIR / "cpu-arm.yaml").read_text()
    if key == "versions":
        text = text.replace('versions: ">=1.16"', f"versions: {value}")
    else:
        text = text.replace('versions: ">=1.16"', f'versions: ">=1.16"\n      install: {value}')
    path = tmp_path / "cpu-arm.yaml"
    path.write_text(text)
    for read in (read_profile_needs, load_profile_file):
        with pytest.raises(ConfigError) as info:
            read(path)
        message = str(info.value)
        assert str(path) in message and f"execution_providers[0].{key}" in message and problem in message


def test_this_machines_openvino_cannot_run_myriad_and_probe_says_so(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "agent.cli.main", "probe", "--json"], capture_output=True, text=True,
                          env=checkout_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    profiles = json.loads(proc.stdout)["profiles"]
    version = openvino.get_version().split("-")[0]
    assert profiles["myriad"]["problems"] == [f"OpenVINOExecutionProvider: openvino {version} is outside >=2021.4,<2023.0"]
    assert profiles["cpu-x86"] == {"status": "ready"} and profiles["cpu-x86-openvino"] == {"status": "ready"}
    assert set(profiles) == {p.name for p in list_profiles() if p.source_file.parent == BUILTIN_DIR}


def test_profiles_are_found_in_the_install_prefix_and_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGE_AGENT_TARGETS_PATH", str(tmp_path))
    (tmp_path / "cpu-arm.yaml").write_text((BUILTIN_DIR / "cpu-arm.yaml").read_text().replace(">=1.16", ">=9.0"))
    dirs = profile_dirs()
    assert dirs[-1] == tmp_path and Path(sys.prefix) / "share" / "edgectl" / "targets" in dirs
    assert profile_needs()["cpu-arm"].needs[0].versions == ">=9.0"  # a later directory wins


def test_the_birth_message_says_which_profiles_the_runtimes_run_and_the_agent_caches_compiled_models(
    tmp_path: Path, mosquitto: BrokerProcess, edgectl_home: EdgectlHome, agents: Callable[..., AgentProcess],
) -> None:
    births: queue.Queue[bytes] = queue.Queue()
    subscriber = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="birth-sub")
    subscriber.on_message = lambda client, userdata, message: births.put(bytes(message.payload))
    subscriber.connect("127.0.0.1", mosquitto.port)
    subscriber.subscribe(topics.device("cam-9", "birth"), qos=1)
    subscriber.loop_start()
    try:
        agent = agents(edgectl_home, "cam-9")
        profiles = Birth.from_payload(births.get(timeout=30)).profiles
    finally:
        subscriber.loop_stop()
        subscriber.disconnect()
    version = openvino.get_version().split("-")[0]
    assert profiles["myriad"]["problems"] == [f"OpenVINOExecutionProvider: openvino {version} is outside >=2021.4,<2023.0"]
    assert "openvino==2022.3" in str(profiles["myriad"]["install"]) and profiles["cpu-x86"] == {"status": "ready"}
    # Measuring OpenVINO for a deployment compiles into the agent's state directory, keyed by version, device, model.
    model = tiny_classifier(tmp_path / "m.onnx", seed=8)
    edgectl_home.edgectl("deploy", str(model), "--device", "cam-9", "--name", "m", "--version", "1", check=True)
    entry = agent.state_dir / "compiled" / f"openvino-{version}" / "CPU" / sha256_file(model)[:16]
    assert list(entry.glob("*.blob")) and json.loads((entry / "load.json").read_text())["first_load_ms"] > 0
