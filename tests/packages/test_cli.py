"""`edgectl build` / `verify` / `deploy` on bad inputs: exit 2 with one line that names the problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgectl.examples import tiny_classifier
from tests.fleet import EdgectlHome


def _bad_models(tmp_path: Path) -> dict[str, Path]:
    not_onnx = tmp_path / "notes.onnx"
    not_onnx.write_text("this is not a model\n")
    good = tiny_classifier(tmp_path / "good.onnx", size=8)
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    return {"not onnx": not_onnx, "truncated": truncated}


@pytest.mark.parametrize("command", ["build", "deploy"])
def test_bad_models_exit_2_with_one_line(tmp_path: Path, offline_home: EdgectlHome, command: str) -> None:
    for case, model in _bad_models(tmp_path).items():
        extra = ["--device", "cam-1"] if command == "deploy" else ["-o", str(tmp_path / "x.edgepkg")]
        result = offline_home.edgectl(command, str(model), "--name", "m", "--version", "1", *extra)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2, f"{case}: {result.returncode} {result.stderr}"
        assert len(lines) == 1 and lines[0].startswith("error:") and str(model.name) in lines[0], f"{case}: {lines}"


def test_verify_accepts_a_good_package_and_refuses_a_tampered_one(tmp_path: Path, offline_home: EdgectlHome) -> None:
    pkg = tmp_path / "m-1.edgepkg"
    offline_home.edgectl("build", str(tiny_classifier(tmp_path / "m.onnx", size=8)), "--name", "m", "--version", "1",
                         "-o", str(pkg), check=True)
    assert offline_home.edgectl("verify", str(pkg)).returncode == 0
    data = bytearray(pkg.read_bytes())
    data[data.index(b"conv1_w") + 20] ^= 0xFF  # inside the model's weights, in the payload
    pkg.write_bytes(bytes(data))
    result = offline_home.edgectl("verify", str(pkg))
    assert result.returncode in (2, 3) and len(result.stderr.strip().splitlines()) == 1, result.stderr
