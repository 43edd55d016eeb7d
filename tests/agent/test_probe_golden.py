"""`edge-agent probe --model M --golden DIR`: backends are checked on real inputs, which a model with structured
inputs (here a voice-like model that needs its sample rate) cannot do without."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from tests.checkout import checkout_env

SAMPLES = 64


def voice_model(path: Path) -> Path:
    """audio float[1, 64] and sr int64 scalar -> frames [sr / 250, 1]: any rate but 16000 cannot be reshaped."""
    nodes = [
        helper.make_node("Constant", [], ["per_frame"], value=helper.make_tensor("per_frame", TensorProto.INT64, [], [250])),
        helper.make_node("Div", ["sr", "per_frame"], ["rows"]),
        helper.make_node("Constant", [], ["minus_one"], value=helper.make_tensor("minus_one", TensorProto.INT64, [1], [-1])),
        helper.make_node("Unsqueeze", ["rows", "zero"], ["rows_1d"]),
        helper.make_node("Concat", ["rows_1d", "minus_one"], ["shape"], axis=0),
        helper.make_node("Reshape", ["audio", "shape"], ["frames"], allowzero=1),
        helper.make_node("Mul", ["frames", "frames"], ["energy"]),
    ]
    graph = helper.make_graph(
        nodes, "voice",
        [helper.make_tensor_value_info("audio", TensorProto.FLOAT, [1, SAMPLES]),
         helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("energy", TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(np.array([0], np.int64), "zero")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _probe(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agent.cli.main", "probe", "--json", "--budget", "0.3", *args],
                          capture_output=True, text=True, timeout=180, env=checkout_env())


def _savez(path: Path, arrays: dict[str, Any]) -> None:
    np.savez(path, allow_pickle=False, **arrays)  # named, so **arrays cannot match it


def _sample(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"audio": rng.uniform(-0.5, 0.5, (1, SAMPLES)).astype(np.float32), "sr": np.array(16000, np.int64)}


def test_a_voice_model_fails_on_noise_and_is_measured_on_its_golden_inputs(tmp_path: Path) -> None:
    model = voice_model(tmp_path / "voice.onnx")
    blind = _probe("--model", str(model))
    lines = blind.stderr.strip().splitlines()
    assert blind.returncode != 0 and len(lines) == 1 and "--golden DIR" in lines[0], blind.stderr
    samples = tmp_path / "samples"
    samples.mkdir()
    _savez(samples / "a.npz", _sample(np.random.default_rng(0)))
    result = _probe("--model", str(model), "--golden", str(samples))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["inputs"] == f"golden, from {samples}"
    figures = {f["backend"]: f for f in report["selection"]["figures"]}
    assert figures["onnxruntime/CPUExecutionProvider"]["status"] == "ok"
    assert all(f["status"] in ("ok", "failed") for f in figures.values()), figures  # checked, never "unverified"
    assert report["selection"]["decision"]["rule"] in ("only", "faster", "estimate", "p95", "memory", "order")


def test_a_package_golden_file_brings_its_expected_outputs(tmp_path: Path) -> None:
    model = voice_model(tmp_path / "voice.onnx")
    sample = _sample(np.random.default_rng(1))
    energy = (sample["audio"].reshape(64, -1) ** 2).astype(np.float32)
    folder = tmp_path / "package-golden"
    folder.mkdir()
    _savez(folder / "golden.npz", {**{f"input:{k}": v for k, v in sample.items()}, "output:energy": energy})
    ok = _probe("--model", str(model), "--golden", str(folder), "--allow", "CPUExecutionProvider")
    assert ok.returncode == 0, ok.stderr
    _savez(folder / "golden.npz", {**{f"input:{k}": v for k, v in sample.items()}, "output:energy": energy + 1})
    wrong = _probe("--model", str(model), "--golden", str(folder), "--allow", "CPUExecutionProvider")
    lines = wrong.stderr.strip().splitlines()
    assert wrong.returncode == 5 and len(lines) == 1 and "output 'energy' is off by" in lines[0], wrong.stderr


def test_samples_that_do_not_fit_the_model_are_one_line_errors(tmp_path: Path) -> None:
    model = voice_model(tmp_path / "voice.onnx")
    folder = tmp_path / "npy"
    folder.mkdir()
    np.save(folder / "a.npy", np.zeros((1, SAMPLES), np.float32))
    result = _probe("--model", str(model), "--golden", str(folder))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "use .npz files with one array per input" in lines[0], result.stderr
    _savez(folder / "b.npz", {"audio": np.zeros((1, SAMPLES), np.float32)})
    (folder / "a.npy").unlink()
    result = _probe("--model", str(model), "--golden", str(folder))
    assert result.returncode == 2 and "missing sr" in result.stderr, result.stderr
