"""Backend choice by measurement on this machine's real onnxruntime and OpenVINO CPU backends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from agent.catalog import Candidate
from agent.hardware import Hardware, probe_hardware
from agent.selection import Selection, Status, model_precision, select_backend
from edgecore.errors import OperationFailed, VerificationError

MODELS = Path(__file__).resolve().parents[3] / "shared" / "models"
ORT_CPU = Candidate("onnxruntime", "CPUExecutionProvider")
OV_CPU = Candidate("openvino", "CPU")


def conv_model(path: Path, weight_type: int = TensorProto.FLOAT) -> Path:
    """A small conv + relu + global pool net: float [1, 3, 16, 16] -> [1, 8, 1, 1]."""
    rng = np.random.default_rng(1)
    np_type = np.float16 if weight_type == TensorProto.FLOAT16 else np.float32
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c"], ["r"]),
            helper.make_node("GlobalAveragePool", ["r"], ["y"]),
        ],
        "conv",
        [helper.make_tensor_value_info("x", weight_type, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", weight_type, [1, 8, 1, 1])],
        [numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np_type), "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


@pytest.fixture(scope="module")
def hardware() -> Hardware:
    return probe_hardware()


# Golden inputs for conv_model: its image input has structure, so without them only the reference device is checked.
CONV_FEEDS = {"x": np.random.default_rng(2).random((1, 3, 16, 16), dtype=np.float32)}


def select(path: Path, hardware: Hardware, cache: Path, **kwargs: Any) -> Selection:
    options = {"allowed_providers": None, "golden": CONV_FEEDS, "expected": None, "time_budget_s": 0.2, **kwargs}
    return select_backend(path, hardware=hardware, cache_dir=cache, **options)


def test_measures_both_cpu_backends_and_picks_the_faster(tmp_path: Path, hardware: Hardware) -> None:
    selection = select(conv_model(tmp_path / "conv.onnx"), hardware, tmp_path / "cache")
    figures = {f.backend: f for f in selection.figures}
    assert set(figures) >= {"onnxruntime/CPUExecutionProvider", "openvino/CPU"}
    passing = [f for f in selection.figures if f.status == "ok"]
    assert all((f.runs or 0) >= 5 and (f.p95_ms or 0) >= (f.median_ms or 0) for f in passing)
    assert selection.backend == min(passing, key=lambda f: f.median_ms or 0).backend
    assert [f.backend for f in selection.figures if f.chosen] == [selection.backend]
    with selection.open() as runner:
        assert runner.name == selection.backend
        runner.infer({"x": np.zeros((1, 3, 16, 16), np.float32)})


def test_decision_is_cached_until_something_changes(tmp_path: Path, hardware: Hardware) -> None:
    model, cache = conv_model(tmp_path / "conv.onnx"), tmp_path / "cache"
    first = select(model, hardware, cache)
    again = select(model, hardware, cache)
    assert again.cached and again.backend == first.backend and again.figures == first.figures
    assert not select(model, hardware, cache, remeasure=True).cached
    assert not select(model, hardware, cache, allowed_providers=["CPUExecutionProvider"]).cached
    (cache / f"selection-{first.model_sha256[:16]}.json").write_text("{not json")
    assert not select(model, hardware, cache).cached
    changed = onnx.load(model)
    changed.doc_string = "retrained"  # same name, other bytes: the sha256 decides
    onnx.save(changed, model)
    assert not select(model, hardware, cache).cached


def test_allowed_list_restricts_candidates(tmp_path: Path, hardware: Hardware) -> None:
    selection = select(conv_model(tmp_path / "conv.onnx"), hardware, tmp_path, allowed_providers=["OpenVINOExecutionProvider"])
    assert [f.backend for f in selection.figures] == ["openvino/CPU"]
    with pytest.raises(VerificationError, match="no backend on this device matches"):
        select(tmp_path / "conv.onnx", hardware, tmp_path, allowed_providers=["TensorrtExecutionProvider"])


def test_a_provider_that_took_no_nodes_is_never_chosen(tmp_path: Path, hardware: Hardware) -> None:
    dropped = Candidate("onnxruntime", "CUDAExecutionProvider")  # not in this build: ORT falls back
    selection = select(conv_model(tmp_path / "conv.onnx"), hardware, tmp_path, candidates=[dropped, ORT_CPU])
    figure = selection.figures[0]
    assert figure.status == "rejected" and "CUDAExecutionProvider took 0/" in figure.reason
    assert selection.backend == "onnxruntime/CPUExecutionProvider"


def test_wrong_outputs_are_rejected(tmp_path: Path, hardware: Hardware) -> None:
    model = conv_model(tmp_path / "conv.onnx")
    golden = {"x": np.ones((1, 3, 16, 16), np.float32)}
    wrong = {"y": np.full((1, 8, 1, 1), 123.0, np.float32)}
    with pytest.raises(OperationFailed, match="output 'y' is off by"):
        select(model, hardware, tmp_path, golden=golden, expected=wrong)


def test_backend_that_cannot_load_is_skipped(tmp_path: Path, hardware: Hardware) -> None:
    broken = Candidate("openvino", "NO_SUCH_DEVICE")
    selection = select(conv_model(tmp_path / "conv.onnx"), hardware, tmp_path, candidates=[broken, ORT_CPU])
    assert selection.figures[0].status == "failed" and "NO_SUCH_DEVICE" in selection.figures[0].reason
    assert selection.backend == ORT_CPU.name


def test_precision_sets_tolerance(tmp_path: Path) -> None:
    assert model_precision(conv_model(tmp_path / "fp32.onnx")) == "fp32"
    assert model_precision(conv_model(tmp_path / "fp16.onnx", TensorProto.FLOAT16)) == "fp16"


def test_real_model_with_reference_io(tmp_path: Path, hardware: Hardware) -> None:
    folder = MODELS / "mnist8-modelzoo"
    if not folder.exists():
        pytest.skip(f"shared models not present at {MODELS}")
    ref = np.load(folder / "reference_io_ort.npz")
    selection = select(
        folder / "mnist-8.onnx", hardware, tmp_path,
        golden={"Input3": ref["input"]}, expected={"Plus214_Output_0": ref["output"]},
    )
    assert {f.status for f in selection.figures} == {"ok"}
    assert selection.to_dict()["precision"] == "fp32"


# A cache file as written before figures and placement were typed records (schema 1).
SCHEMA_1 = {
    "schema": 1, "key": "k", "model": "/slots/a/conv.onnx", "model_sha256": "ab" * 32, "backend": "openvino/CPU",
    "candidate": {"backend": "openvino", "device": "CPU", "options": {}}, "precision": "fp32", "measured_at": 1.5,
    "cached": False,
    "figures": [
        {"backend": "onnxruntime/CPUExecutionProvider", "options": {}, "status": "ok", "load_ms": 3.1,
         "placement": {"backend": "onnxruntime", "requested": "CPUExecutionProvider", "effective": "CPUExecutionProvider",
                       "verdict": "cpu", "nodes": {"CPUExecutionProvider": 3}, "total_nodes": 3, "accelerated_fraction": 1.0},
         "max_rel_error": 0.0, "runs": 40, "median_ms": 0.05, "p95_ms": 0.07, "chosen": False},
        {"backend": "openvino/CPU", "options": {}, "status": "ok", "load_ms": 20.0,
         "placement": {"backend": "openvino", "requested": "CPU", "effective": "CPU", "verdict": "cpu",
                       "config": {"PERFORMANCE_HINT": "LATENCY"}},
         "max_rel_error": 1e-7, "runs": 40, "median_ms": 0.04, "p95_ms": 0.06, "chosen": True},
        {"backend": "onnxruntime/CUDAExecutionProvider", "options": {}, "status": "rejected", "load_ms": 2.0,
         "placement": {"backend": "onnxruntime", "requested": "CUDAExecutionProvider", "effective": "CPUExecutionProvider",
                       "verdict": "none", "nodes": {"CPUExecutionProvider": 3}, "total_nodes": 3, "accelerated_fraction": 0.0},
         "reason": "CUDAExecutionProvider took 0/3 nodes: it would run on CPUExecutionProvider", "chosen": False},
        {"backend": "openvino/NPU", "options": {}, "status": "failed", "reason": "no NPU plugin", "chosen": False},
    ],
}


def test_cached_schema_1_files_read_back_unchanged() -> None:
    selection = Selection.from_dict(SCHEMA_1, Path("/slots/a/conv.onnx"), cached=False)
    assert selection.to_dict() == SCHEMA_1
    assert [f.status for f in selection.figures] == [Status.OK, Status.OK, Status.REJECTED, Status.FAILED]
    placement = selection.figures[2].placement
    assert placement is not None and not placement.accelerated and placement.nodes == {"CPUExecutionProvider": 3}
    assert selection.figures[1].candidate == selection.candidate


def test_the_decision_is_recorded_with_its_ratio_interval_and_blocks(tmp_path: Path, hardware: Hardware) -> None:
    """Structure only: which backend wins on this machine is timing, and the rule is tested in test_timing.py."""
    model, cache = conv_model(tmp_path / "conv.onnx"), tmp_path / "cache"
    selection = select(model, hardware, cache, candidates=[ORT_CPU, OV_CPU])
    decision = selection.decision
    assert decision is not None and decision.winner == selection.backend and decision.blocks >= 5
    assert decision.runner_up == ({ORT_CPU.name, OV_CPU.name} - {selection.backend}).pop()
    assert decision.ratio is not None and decision.low is not None and decision.high is not None
    assert decision.low <= decision.ratio <= decision.high
    assert decision.rule in ({"p95", "memory", "order"} if decision.tie else {"faster", "estimate"})
    asked = [f.memory_mb for f in selection.figures if f.memory_mb is not None]  # only a tie past p95 asks
    assert all(mb > 0 for mb in asked) and (not asked or decision.tie)
    again = select(model, hardware, cache, candidates=[ORT_CPU, OV_CPU])
    assert again.cached and again.decision == decision
    assert again.to_dict()["decision"] == selection.to_dict()["decision"]


def test_a_single_passing_candidate_is_the_decision(tmp_path: Path, hardware: Hardware) -> None:
    broken = Candidate("openvino", "NO_SUCH_DEVICE")
    selection = select(conv_model(tmp_path / "conv.onnx"), hardware, tmp_path, candidates=[ORT_CPU, broken])
    assert selection.decision is not None
    assert (selection.decision.winner, selection.decision.rule, selection.decision.tie) == (ORT_CPU.name, "only", False)


def test_candidates_sharing_a_name_are_told_apart_by_their_options(tmp_path: Path, hardware: Hardware) -> None:
    """CoreML's two model formats share one runner name; the pick must be the figure the contest chose."""
    throughput = Candidate("openvino", "CPU", {"PERFORMANCE_HINT": "THROUGHPUT"})
    selection = select(conv_model(tmp_path / "conv.onnx"), hardware, tmp_path, candidates=[OV_CPU, throughput])
    decision = selection.decision
    labels = {"openvino/CPU", "openvino/CPU[PERFORMANCE_HINT=THROUGHPUT]"}
    assert decision is not None and {decision.winner, decision.runner_up} == labels
    chosen = [f for f in selection.figures if f.chosen]
    assert len(chosen) == 1 and chosen[0].candidate == selection.candidate
    assert ("[" in decision.winner) == bool(selection.candidate.options)
