"""Compiled-model caches: OpenVINO's CACHE_DIR for real, TensorRT's options through the session seam, the sweep."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from edgecore.backends.onnxruntime import TENSORRT_EP, OrtRunner, OrtSessionLoader
from edgecore.backends.openvino import OvModelLoader, OvRunner
from edgecore.compiled_cache import entry_for, sweep_compiled, use_root
from edgecore.protocol.package import sha256_file
from edgectl.examples import tiny_classifier
from tests.checkout import checkout_env


def test_openvino_compiles_once_then_reads_its_cache(tmp_path: Path) -> None:
    model = tiny_classifier(tmp_path / "m.onnx", seed=1)
    cache = tmp_path / "compiled"
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    loads = []
    outputs = []
    for _ in range(2):
        with OvRunner(OvModelLoader(model, "CPU", cache_dir=cache)) as runner:
            loads.append(runner.placement.load)
            outputs.append(next(iter(runner.infer({"image": x}).values())))
    first, second = loads
    assert first is not None and second is not None
    assert first["cache"] == "miss" and "first_load_ms" not in first
    assert second["cache"] == "hit" and second["first_load_ms"] == first["load_ms"]
    entry = next(cache.glob("openvino-*/CPU/*"))
    assert entry.name == sha256_file(model)[:16] and list(entry.glob("*.blob"))
    np.testing.assert_array_equal(outputs[0], outputs[1])


def test_without_a_cache_openvino_says_off(tmp_path: Path) -> None:
    # An in-process Agent of an earlier test on this worker set the process's cache root (agent/daemon.py): clear it.
    use_root(None)
    model = tiny_classifier(tmp_path / "m.onnx", seed=2)
    with OvRunner(OvModelLoader(model, "CPU", cache_dir=None)) as runner:
        load = runner.placement.load
    assert load is not None and load["cache"] == "off"
    assert not list(tmp_path.rglob("*.blob"))


def test_another_model_or_runtime_version_gets_its_own_key(tmp_path: Path) -> None:
    a, b = tiny_classifier(tmp_path / "a.onnx", seed=3), tiny_classifier(tmp_path / "b.onnx", seed=4)
    keys = {entry_for(tmp_path, "openvino", "2026.4.1", "CPU", sha256_file(m), "*.blob").path for m in (a, b)}
    keys.add(entry_for(tmp_path, "openvino", "2022.3.1", "CPU", sha256_file(a), "*.blob").path)
    keys.add(entry_for(tmp_path, "openvino", "2026.4.1", "GPU.0", sha256_file(a), "*.blob").path)
    assert len(keys) == 4


class _Recorder:
    """Stands for onnxruntime.InferenceSession: records what TensorRT would be given (no GPU here), then builds
    a real CPU session so the runner can go on."""

    def __init__(self) -> None:
        self.providers: list[Any] = []

    def __call__(self, path: str, options: Any, providers: list[Any]) -> Any:
        self.providers = providers
        return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def test_tensorrt_gets_engine_and_timing_caches_under_the_models_key(tmp_path: Path) -> None:
    model = tiny_classifier(tmp_path / "m.onnx", seed=5)
    cache = tmp_path / "compiled"
    record = _Recorder()
    loader = OrtSessionLoader(model, TENSORRT_EP, {"device_id": "0", "trt_fp16_enable": "1"}, cache_dir=cache,
                              session_factory=record)
    with OrtRunner(loader) as runner:
        load = runner.placement.load
    (name, options), fallback = record.providers
    key = cache / f"onnxruntime-{ort.__version__}" / f"{TENSORRT_EP}.0" / sha256_file(model)[:16]
    assert name == TENSORRT_EP and fallback == "CPUExecutionProvider"
    assert options == {"device_id": "0", "trt_fp16_enable": "1", "trt_engine_cache_enable": "True",
                       "trt_engine_cache_path": str(key), "trt_timing_cache_enable": "True",
                       "trt_timing_cache_path": str(key)}
    assert load is not None and load["cache"] == "miss"
    (key / "TensorrtExecutionProvider_cache_sm87.engine").write_bytes(b"engine")  # as the provider would leave it
    with OrtRunner(OrtSessionLoader(model, TENSORRT_EP, cache_dir=cache, session_factory=record)) as runner:
        again = runner.placement.load
    assert again is not None and again["cache"] == "hit" and again["first_load_ms"] == load["load_ms"]


def test_cpu_sessions_compile_nothing_and_get_no_cache(tmp_path: Path) -> None:
    model = tiny_classifier(tmp_path / "m.onnx", seed=6)
    record = _Recorder()
    with OrtRunner(OrtSessionLoader(model, cache_dir=tmp_path / "c", session_factory=record)) as runner:
        assert runner.placement.load is not None and runner.placement.load["cache"] == "off"
    assert record.providers == [("CPUExecutionProvider", {})]
    assert not (tmp_path / "c").exists()


def _fill(root: Path, version: str, sha: str, size: int, age: float) -> Path:
    entry = entry_for(root, "openvino", version, "CPU", sha, "*.blob").path
    (entry / "x.blob").write_bytes(b"\0" * size)
    os.utime(entry, (age, age))
    return entry


def test_sweep_keeps_the_models_on_the_device_within_the_bound(tmp_path: Path) -> None:
    old = _fill(tmp_path, "2026.4.1", "a" * 64, 1000, 1_000)
    new = _fill(tmp_path, "2026.4.1", "b" * 64, 1000, 2_000)
    upgraded = _fill(tmp_path, "2026.5.0", "b" * 64, 1000, 3_000)
    gone = _fill(tmp_path, "2026.4.1", "c" * 64, 1000, 4_000)
    removed = sweep_compiled(tmp_path, keep={"a" * 16, "b" * 16}, max_bytes=2500)
    assert not gone.exists() and not old.exists()  # not on the device any more; then the least recently used
    assert new.exists() and upgraded.exists()
    assert sorted(removed) == sorted(str(p.relative_to(tmp_path)) for p in (gone, old))
    assert sweep_compiled(tmp_path, keep={"b" * 16}, max_bytes=10**9) == []


def test_a_damaged_load_record_is_a_miss_without_a_first_time(tmp_path: Path) -> None:
    entry = entry_for(tmp_path, "openvino", "1", "CPU", "d" * 64, "*.blob")
    (entry.path / "load.json").write_text("{not json")
    figures = entry.record(hit=True, load_ms=5.0)
    assert figures.cache == "hit" and figures.first_load_ms is None
    assert json.loads(json.dumps(figures.to_dict())) == {"cache": "hit", "load_ms": 5.0}


@pytest.mark.parametrize("device", ["GPU.0", "../x", ".hidden"])
def test_key_components_stay_inside_the_root(tmp_path: Path, device: str) -> None:
    entry = entry_for(tmp_path / "root", "openvino", "1", device, "e" * 64, "*.blob")
    assert entry.path.resolve().is_relative_to((tmp_path / "root").resolve())


def test_probe_reports_the_first_and_the_cached_load(tmp_path: Path) -> None:
    model = tiny_classifier(tmp_path / "m.onnx", seed=7)
    (tmp_path / "golden").mkdir()
    np.save(tmp_path / "golden" / "sample.npy", np.random.default_rng(1).random((1, 3, 32, 32), np.float32))
    proc = subprocess.run([sys.executable, "-m", "agent.cli.main", "probe", "--json", "--model", str(model), "--budget",
                           "0.3", "--allow", "openvino", "--golden", str(tmp_path / "golden")],
                          capture_output=True, text=True, env=checkout_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr
    cached = json.loads(proc.stdout)["selection"]["compiled_cache"]
    assert cached["backend"] == "openvino/CPU" and cached["cache"] == "hit"
    assert cached["first_load_ms"] > 0 and cached["cached_load_ms"] > 0
