"""`edge-agent probe --model M --input-shape NAME=...`: a fully dynamic input is measured in the shape given, or refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.checkout import checkout_env
from tests.packages.test_golden import dynamic_model


def _probe(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agent.cli.main", "probe", "--json", *args], capture_output=True,
                          text=True, timeout=120, env=checkout_env())


def test_probe_refuses_a_dynamic_input_without_a_shape(tmp_path: Path) -> None:
    result = _probe("--model", str(dynamic_model(tmp_path / "d.onnx")))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "--input-shape image=1x3xHxW" in lines[0], result.stderr


def test_probe_measures_in_the_shape_given(tmp_path: Path) -> None:
    result = _probe("--model", str(dynamic_model(tmp_path / "d.onnx")), "--input-shape", "image=1x3x32x32",
                    "--budget", "0.3", "--allow", "CPUExecutionProvider")
    assert result.returncode == 0, result.stderr
    selection = json.loads(result.stdout)["selection"]
    assert selection["backend"] == "onnxruntime/CPUExecutionProvider"
    assert all(f["status"] == "ok" for f in selection["figures"]), selection["figures"]
