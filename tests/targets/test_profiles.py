"""Profiles load, validate with errors naming file and key, and user directories add to them."""

from __future__ import annotations

from pathlib import Path

import pytest

import targets
from edgecore.errors import ConfigError, NotFoundError

REQUIRED = {"jetson-orin", "jetson-nano", "myriad", "intel-npu", "nnapi", "qnn-htp", "cpu-x86", "cpu-arm",
            "coreml-neuralnetwork", "coreml-mlprogram", "edgetpu"}


def test_builtin_profiles_load_and_cpu_is_last() -> None:
    profiles = {p.name: p for p in targets.list_profiles()}
    assert set(profiles) >= REQUIRED
    for profile in profiles.values():
        if profile.unsupported is not None:  # edgetpu: no ONNX runtime drives it
            assert profile.execution_providers == () and profile.to_dict()["unsupported"]["conversion"]
            continue
        assert profile.execution_providers[-1].name == "CPUExecutionProvider"
        assert profile.to_dict()["name"] == profile.name
    assert [ep.name for ep in profiles["jetson-orin"].execution_providers] == [
        "TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    assert profiles["jetson-orin"].precision.format == "int8-qdq-symmetric"
    assert profiles["nnapi"].precision.activations == "uint8"
    assert profiles["myriad"].shape.static_required and profiles["myriad"].partition.max_partitions == 10
    assert any("2022.3" in note for note in profiles["myriad"].notes)
    for fmt in ("NeuralNetwork", "MLProgram"):
        coreml = profiles[f"coreml-{fmt.lower()}"].execution_providers[0]
        assert coreml.name == "CoreMLExecutionProvider" and coreml.options["ModelFormat"] == fmt
    assert profiles["coreml-mlprogram"].precision.format == "fp16"
    assert profiles["coreml-neuralnetwork"].precision.format == "fp32"
    unsupported = profiles["edgetpu"].unsupported
    assert unsupported is not None and "edgetpu_compiler" in unsupported.reason


def test_unknown_profile_lists_known_names() -> None:
    with pytest.raises(NotFoundError, match=r"known: .*nnapi"):
        targets.load_profile("no-such-target")


def _write(directory: Path, name: str, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.yaml"
    path.write_text(text)
    return path


VALID = (Path(targets.profile.BUILTIN_DIR) / "cpu-x86.yaml").read_text()


def test_user_directory_adds_a_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path / "mine", "my-box", VALID.replace("name: cpu-x86", "name: my-box"))
    monkeypatch.setenv("EDGECTL_TARGETS_PATH", str(tmp_path / "mine"))
    assert targets.load_profile("my-box").source_file == tmp_path / "mine" / "my-box.yaml"


@pytest.mark.parametrize("old,new,key", [
    ("max_partitions: 1", "max_partitions: zero", "partition.max_partitions"),
    ("format: fp32", "format: bf99", "precision.format"),
    ("op_support: {source: ort-cpu}", "op_support: {source: magic}", "execution_providers[0].op_support.source"),
    ("static_required: false", "static_required: maybe", "shape.static_required"),
    ("name: cpu-x86", "name: other", "name"),
])
def test_broken_profile_names_file_and_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           old: str, new: str, key: str) -> None:
    assert old in VALID
    path = _write(tmp_path, "cpu-x86", VALID.replace(old, new))
    monkeypatch.setenv("EDGECTL_TARGETS_PATH", str(tmp_path))
    with pytest.raises(ConfigError) as info:
        targets.load_profile("cpu-x86")
    assert str(path) in str(info.value) and f"key '{key}'" in str(info.value)
