"""Partitioned pieces run in sequence reproduce the original outputs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import targets
from edgecore.modelcheck import load_model_checked
from edgecore.partitions import PartitionedRunner, load_plan
from targets.partitioner import write_partitions
from tests.targets import graphs

MODELS = Path(__file__).resolve().parents[2].parent / "shared" / "models"


def _reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=False))


def _split_and_run(model: onnx.ModelProto, target: str, out: Path, feeds: dict[str, np.ndarray],
                   **limits: int) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    analysis = targets.analyse(model, targets.load_profile(target), **limits)
    manifest = json.loads(write_partitions(model, analysis, out).read_text())
    with PartitionedRunner(load_plan(out)) as runner:
        outputs = runner.run(feeds)
        assert len(runner.fallbacks) == sum(p["accelerator"] for p in manifest["pieces"])  # no NNAPI here
    return manifest, outputs


def test_three_pieces_reproduce_the_model(tmp_path: Path) -> None:
    model = graphs.unsupported_in_middle()
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)}
    manifest, outputs = _split_and_run(model, "nnapi", tmp_path, feeds)
    assert [p["provider"] for p in manifest["pieces"]] == [
        "NnapiExecutionProvider", "CPUExecutionProvider", "NnapiExecutionProvider"]
    assert manifest["pieces"][1]["inputs"] == ["h1"]
    assert np.max(np.abs(outputs["y"] - _reference(model, feeds)["y"])) <= 1e-5


def test_merged_partitions_are_reported_in_the_manifest(tmp_path: Path) -> None:
    model = graphs.unsupported_in_middle()
    feeds = {"x": np.ones((2, 8), np.float32)}
    manifest, outputs = _split_and_run(model, "nnapi", tmp_path, feeds, min_partition_nodes=5)
    assert len(manifest["pieces"]) == 1 and len(manifest["merges"]) == 2
    assert np.max(np.abs(outputs["y"] - _reference(model, feeds)["y"])) <= 1e-5


def test_if_body_reading_outer_scope_survives_the_split(tmp_path: Path) -> None:
    model = graphs.with_if()
    for cond in (True, False):
        feeds = {"x": np.array([[1, -2, 3, -4]], np.float32), "cond": np.array(cond)}
        manifest, outputs = _split_and_run(model, "qnn-htp", tmp_path / str(cond), feeds, min_partition_nodes=1)
        assert len(manifest["pieces"]) == 3
        assert np.max(np.abs(outputs["y"] - _reference(model, feeds)["y"])) <= 1e-5


def test_real_model_magika_on_nnapi(tmp_path: Path) -> None:
    folder = MODELS / "magika-standard_v3_3"
    if not folder.is_dir():
        pytest.skip(f"{folder} absent (real models live in ../shared/models)")
    model = load_model_checked(folder / "model.onnx")
    reference = np.load(folder / "reference_io_ort.npz")
    feeds = {"bytes": reference["bytes"][:4].astype(np.int32)}
    manifest, outputs = _split_and_run(model, "nnapi", tmp_path, feeds)
    assert len(manifest["pieces"]) == 3
    assert np.max(np.abs(outputs["target_label"] - reference["target_label"][:4])) <= 1e-5
