"""The native OpenVINO backend on whichever OpenVINO is installed: ./scripts/test-openvino-versions runs this
module under each release the package index serves for this Python (2023.0.0, whose API still lives in
``openvino.runtime`` as 2022.3 LTS's does, up to the newest).

It needs only openvino, onnx and numpy (no conftest, no broker), so an old release's venv can run it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgecore.backends.openvino import OvModelLoader, OvRunner, api, installed_plugins, runtime_version


def _model(path: Path) -> Path:
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], [weight])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=7), str(path))
    return path


def test_the_backend_loads_infers_and_caches_on_this_openvino(tmp_path: Path) -> None:
    model = _model(tmp_path / "m.onnx")
    x = np.arange(8, dtype=np.float32).reshape(2, 4) - 3
    w = numpy_helper.to_array(onnx.load(str(model)).graph.initializer[0])
    loads = []
    for _ in range(2):
        with OvRunner(OvModelLoader(model, "CPU", cache_dir=tmp_path / "cache")) as runner:
            assert [s.name for s in runner.inputs] == ["x"] and runner.outputs[0].dtype == "float32"
            np.testing.assert_allclose(runner.infer({"x": x})["y"], np.maximum(x @ w, 0), rtol=1e-5, atol=1e-6)
            assert runner.placement.verdict.value == "cpu"
            loads.append(runner.placement.load)
    assert [load["cache"] for load in loads if load] == ["miss", "hit"]
    assert "CPU" in installed_plugins()
    assert runtime_version()[0].isdigit()


def test_the_api_module_is_the_one_this_release_has() -> None:
    import openvino

    expected = openvino if hasattr(openvino, "Core") else importlib.import_module("openvino.runtime")
    assert api() is expected
    assert importlib.util.find_spec("openvino") is not None
