"""`edgectl build --target nnapi --ort-out DIR`: the ORT-format model and the reduced build's operator config."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

from edgectl.examples import tiny_classifier
from tests.checkout import checkout_env


def _edgectl(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edgectl.cli.main", *args], capture_output=True, text=True,
                          env=checkout_env(EDGECTL_HOME=str(home)), cwd=home, timeout=300)


def test_nnapi_build_emits_an_ort_model_that_answers_like_the_onnx_one(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    assert _edgectl(home, "keys", "init").returncode == 0
    model = tiny_classifier(tmp_path / "det.onnx", seed=9)
    out = tmp_path / "android"
    built = _edgectl(home, "build", str(model), "--name", "det", "--version", "1", "--target", "nnapi", "--ort-out",
                     str(out), "-o", str(tmp_path / "det.edgepkg"), "--json")
    assert built.returncode == 0, built.stderr
    ort_model, config = out / "det.ort", out / "det.required_operators_and_types.config"
    x = np.random.default_rng(1).standard_normal((1, 3, 32, 32)).astype(np.float32)
    want = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"image": x})[0]
    got = ort.InferenceSession(str(ort_model), providers=["CPUExecutionProvider"]).run(None, {"image": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    operators = config.read_text()
    for op in ("Conv", "Relu", "GlobalAveragePool", "Gemm", "Softmax"):
        assert op in operators, op
    assert '{"inputs": {"0": ["float"]}}' in operators  # type reduction: the build keeps float kernels only
    manifest = json.loads(built.stdout)
    shipped = {f["path"]: f for f in manifest["files"]}
    assert shipped["model.ort"]["role"] == "ort" and shipped["model.ort"]["size"] == ort_model.stat().st_size


def test_ort_out_is_for_nnapi_only(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    model = tiny_classifier(tmp_path / "det.onnx", seed=9)
    result = _edgectl(home, "build", str(model), "--name", "det", "--version", "1", "--target", "cpu-x86", "--ort-out",
                      str(tmp_path / "o"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["error: --ort-out is for --target nnapi (an Android app's reduced "
                                                  "onnxruntime), not 'cpu-x86'"]
    assert not (tmp_path / "o").exists()
