"""The runner contract on real onnxruntime and OpenVINO, with models generated in code."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from agent.catalog import Candidate
from edgecore.backends import Placement, Runner
from edgecore.backends.onnxruntime import OrtRunner, OrtSessionLoader, available_providers
from edgecore.backends.openvino import OvModelLoader, OvRunner
from edgecore.errors import InternalError, ModelError, UserError

BACKENDS = [Candidate("onnxruntime", "CPUExecutionProvider"), Candidate("openvino", "CPU")]


def affine_model(path: Path) -> Path:
    """y = x @ W + b with a symbolic batch: float32 [batch, 4] -> [batch, 3]."""
    weights = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["xw"]),
            helper.make_node("Add", ["xw", "b"], ["xwb"]),
            # OpenVINO folds a final Identity and names the port after its input too.
            helper.make_node("Identity", ["xwb"], ["y"]),
        ],
        "affine",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        [onnx.numpy_helper.from_array(weights, "W"), onnx.numpy_helper.from_array(np.ones(3, np.float32), "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # onnx 1.23 writes IR 14 by default; onnxruntime 1.31 reads up to 13
    onnx.save(model, path)
    return path


def zipmap_model(path: Path) -> Path:
    """An ONNX-ML classifier whose probabilities come out as a list of maps (not a tensor)."""
    nodes = [
        helper.make_node(
            "LinearClassifier", ["x"], ["label", "scores"], domain="ai.onnx.ml",
            coefficients=[1.0, 0.0, 0.0, 1.0], intercepts=[0.0, 0.0], classlabels_ints=[0, 1],
        ),
        helper.make_node("ZipMap", ["scores"], ["probabilities"], domain="ai.onnx.ml", classlabels_int64s=[0, 1]),
    ]
    graph = helper.make_graph(
        nodes, "zipmap",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor_value_info("label", TensorProto.INT64, [1]),
         helper.make_value_info("probabilities", helper.make_sequence_type_proto(
             helper.make_map_type_proto(TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, []))))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


@pytest.fixture(params=BACKENDS, ids=lambda c: c.name)
def runner(request: pytest.FixtureRequest, tmp_path: Path) -> Runner:
    candidate: Candidate = request.param
    return candidate.open(affine_model(tmp_path / "affine.onnx"))


def test_specs_and_infer(runner: Runner) -> None:
    with runner:
        assert [(s.name, s.dtype) for s in runner.inputs] == [("x", "float32")]
        assert runner.inputs[0].shape[1] == 4 and runner.outputs[0].name == "y"
        x = np.ones((2, 4), np.float32)
        y = runner.infer({"x": x})["y"]
        expected = x @ (np.arange(12, dtype=np.float32).reshape(4, 3) / 10) + 1
        np.testing.assert_allclose(y, expected, rtol=1e-5)
        assert runner.placement.verdict == "cpu"
    assert not runner.is_active


@pytest.mark.parametrize(
    ("feeds", "message"),
    [
        ({"x": np.ones((1, 4), np.float64)}, "input 'x' expects dtype float32, got float64"),
        ({"x": np.ones((1, 5), np.float32)}, "input 'x' expects shape"),
        ({"x": np.ones((4,), np.float32)}, "input 'x' expects shape"),
        ({"x": [[1.0, 2.0, 3.0, 4.0]]}, "input 'x' must be a numpy array"),
        ({}, "missing input 'x'"),
        ({"x": np.ones((1, 4), np.float32), "z": np.ones(1)}, "unknown input 'z'"),
    ],
)
def test_bad_feeds_name_the_tensor(runner: Runner, feeds: dict[str, Any], message: str) -> None:
    with runner, pytest.raises(UserError, match=message.replace("(", r"\(")):
        runner.infer(feeds)


def test_inactive_runner_refuses(runner: Runner) -> None:
    with pytest.raises(InternalError, match="not active"):
        runner.infer({"x": np.ones((1, 4), np.float32)})
    runner.deactivate()  # a no-op, never raises on cleanup paths


def test_concurrent_infer_is_correct(runner: Runner) -> None:
    with runner:
        batches = [np.full((1, 4), i, np.float32) for i in range(64)]
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda x: runner.infer({"x": x})["y"], batches))
        for i, y in enumerate(results):
            np.testing.assert_allclose(y, runner.infer({"x": batches[i]})["y"])


def test_onnx_ml_maps_run_on_onnxruntime_only(tmp_path: Path) -> None:
    path = zipmap_model(tmp_path / "zipmap.onnx")
    with OrtRunner(OrtSessionLoader(path)) as ort_runner:
        out = ort_runner.infer({"x": np.array([[0.2, 0.9]], np.float32)})
        assert out["label"].tolist() == [1]
        assert isinstance(out["probabilities"], list)
        assert [s.dtype for s in ort_runner.outputs] == ["int64", "object"]
    with pytest.raises(ModelError, match="openvino/CPU cannot load it"):
        OvRunner(OvModelLoader(path)).activate()


def test_unloadable_model_is_a_model_error(tmp_path: Path) -> None:
    path = tmp_path / "broken.onnx"
    path.write_bytes(b"not a model")
    with pytest.raises(ModelError, match=r"broken\.onnx: onnxruntime/CPUExecutionProvider cannot load it"):
        OrtRunner(OrtSessionLoader(path)).activate()


def test_provider_that_takes_no_nodes_is_reported_as_cpu(tmp_path: Path) -> None:
    """ORT keeps an accelerator EP that claims nothing; placement must say where nodes ran."""
    extra = [p for p in available_providers() if p != "CPUExecutionProvider"]
    provider = extra[0] if extra else "CUDAExecutionProvider"  # absent: ORT drops it silently
    with OrtRunner(OrtSessionLoader(affine_model(tmp_path / "m.onnx"), provider)) as runner:
        placement = runner.placement
    assert placement.requested == provider
    assert placement.verdict == "none" and not placement.accelerated
    assert placement.effective == "CPUExecutionProvider"
    assert placement.nodes is not None and placement.nodes.get(provider, 0) == 0
    assert placement.total_nodes is not None and placement.total_nodes > 0
    assert Placement.from_dict(placement.to_dict()) == placement


def test_openvino_config_defaults_keep_f32(tmp_path: Path) -> None:
    loader = OvModelLoader(affine_model(tmp_path / "m.onnx"), "CPU", {"NUM_STREAMS": 1})
    assert loader.config == {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32", "NUM_STREAMS": "1"}
    with OvRunner(loader) as runner:
        assert runner.placement.effective == "CPU"
