"""The deployment's shadow run loads the new model on the serving backend only after a trial in a child process.

The first load of a runtime on a new model may crash it, and in the agent's process that would end
the agent: so the serving backend is tried on the new model in a child first, and when it fails
there (here OpenVINO cannot convert an ONNX-ML op; a crash is handled alike, see
test_selection_rules), the shadow run uses the reference device, which staging already ran it on.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from agent.catalog import Candidate
from tests.agent.serving_host import install, serving_host
from tests.agent.test_idle_remeasure import cast_model

pytest.importorskip("openvino", reason="OpenVINO is not installed: the serving backend is the reference device")

ORT_CPU = Candidate("onnxruntime", "CPUExecutionProvider")
OV_CPU = Candidate("openvino", "CPU")


def scaled_cast_model(path: Path) -> Path:
    """The cast model behind an identity ai.onnx.ml Scaler: the same answers, but OpenVINO cannot load it."""
    nodes = [helper.make_node("Scaler", ["x"], ["s"], domain="ai.onnx.ml", offset=[0.0] * 4, scale=[1.0] * 4),
             helper.make_node("Cast", ["s"], ["y"], to=TensorProto.UINT8)]
    graph = helper.make_graph(nodes, "scaled", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, ["N", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_a_new_model_the_serving_backend_fails_is_shadowed_on_the_reference_device(tmp_path: Path) -> None:
    host = serving_host(cast_model(tmp_path / "cast.onnx"), tmp_path, stale=OV_CPU)  # serving on OpenVINO
    with host.registry.acquire("m") as entry:
        host.registry.remember_inputs(entry, {"x": np.full((2, 4), 7.0, np.float32)})
    staged, manifest = install(scaled_cast_model(tmp_path / "scaled.onnx"), "m", 2, host.slots, tmp_path)
    agreement = host.shadow("m", host.slots.dir(staged.slot), manifest)
    assert agreement is not None and (agreement.backend, agreement.agreement, agreement.live) == (ORT_CPU.name, 1.0, 2), agreement
    assert agreement.to_dict()["backend"] == ORT_CPU.name
    same, manifest = install(cast_model(tmp_path / "cast-2.onnx"), "m", 3, host.slots, tmp_path)
    trial = host.shadow("m", host.slots.dir(same.slot), manifest)
    assert trial is not None and trial.backend == OV_CPU.name  # passes its trial: serving's
