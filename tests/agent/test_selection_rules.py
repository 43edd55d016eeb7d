"""Backend selection on real runtimes: a clearly faster backend wins, inputs with structure are never judged on
noise, and a runtime that crashes on the model fails its candidate in a child process, never this one.

The speed tests use models where one backend is several times faster than the other on any machine
(onnxruntime runs a softmax over a non-last axis through a transpose; OpenVINO pays a fixed cost per
inference that dwarfs a tiny model), listed so that the tie rule (memory, then candidate order) would
pick the slower one: only a measured difference can pick the right one.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from agent.catalog import Candidate
from agent.hardware import Hardware, probe_hardware
from agent.measure import Status, input_structure
from agent.selection import Decision, select_backend
from edgecore.backends import TensorSpec
from edgecore.errors import ModelError
from tests.agent.test_backends import affine_model
from tests.agent.test_selection import conv_model

ORT_CPU = Candidate("onnxruntime", "CPUExecutionProvider")
OV_CPU = Candidate("openvino", "CPU")


def _model(path: Path, node: onnx.NodeProto, inputs: list[onnx.ValueInfoProto], output: str) -> Path:
    dtype = inputs[0].type.tensor_type.elem_type
    graph = helper.make_graph([node], path.stem, inputs, [helper.make_tensor_value_info(output, dtype, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def softmax_over_channels(path: Path) -> Path:
    """Softmax over axis 1 of [1, 64, 64, 64]: onnxruntime transposes around it, about 4x slower than OpenVINO here."""
    return _model(path, helper.make_node("Softmax", ["x"], ["y"], axis=1),
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 64, 64])], "y")


def string_echo(path: Path) -> Path:
    """text (string[N]) -> echo: OpenVINO runs it, then aborts with free(): invalid pointer when the runner closes."""
    return _model(path, helper.make_node("Identity", ["text"], ["echo"]),
                  [helper.make_tensor_value_info("text", TensorProto.STRING, ["N"])], "echo")


@pytest.fixture(scope="module")
def hardware() -> Hardware:
    return probe_hardware()


def _won_on_speed(decision: Decision | None, winner: str) -> None:
    """``winner`` won on speed: beyond the noise, or (a machine too loaded to settle it within the budget) by the
    estimate; never by a tie rule, which here would pick the other."""
    assert decision is not None and decision.winner == winner, decision
    assert not decision.tie and decision.rule in ("faster", "estimate") and (decision.ratio or 0) > 1.5, decision


def test_openvino_wins_where_it_is_several_times_faster_though_order_and_memory_favour_onnxruntime(
        tmp_path: Path, hardware: Hardware) -> None:
    pytest.importorskip("openvino", reason="OpenVINO is not installed")
    model = softmax_over_channels(tmp_path / "softmax.onnx")
    golden = {"x": np.random.default_rng(0).standard_normal((1, 64, 64, 64)).astype(np.float32)}
    selection = select_backend(model, hardware=hardware, allowed_providers=None, golden=golden, expected=None,
                               cache_dir=tmp_path, time_budget_s=5.0, candidates=[ORT_CPU, OV_CPU])
    _won_on_speed(selection.decision, OV_CPU.name)


def test_onnxruntime_wins_where_it_is_several_times_faster_though_listed_last(tmp_path: Path, hardware: Hardware) -> None:
    pytest.importorskip("openvino", reason="OpenVINO is not installed")
    model = affine_model(tmp_path / "affine.onnx")  # a few microseconds of work against OpenVINO's fixed cost
    selection = select_backend(model, hardware=hardware, allowed_providers=None, golden={"x": np.ones((2, 4), np.float32)},
                               expected=None, cache_dir=tmp_path, time_budget_s=5.0, candidates=[OV_CPU, ORT_CPU])
    _won_on_speed(selection.decision, ORT_CPU.name)


def test_input_structure_says_where_noise_cannot_stand_for_real_inputs() -> None:
    assert input_structure([TensorSpec("x", "float32", ["batch", 4])]) is None
    assert input_structure([TensorSpec("x", "float16", [8])]) is None
    assert "rank 4 is an image" in (input_structure([TensorSpec("x", "float32", [1, 3, 224, 224])]) or "")
    assert "rank 3" in (input_structure([TensorSpec("audio", "float32", [1, 1, 16000])]) or "")
    assert "int32: its values mean" in (input_structure([TensorSpec("bytes", "int32", ["n", 2048])]) or "")
    assert "object" in (input_structure([TensorSpec("text", "object", ["N"])]) or "")
    voice = [TensorSpec("input", "float32", [1, 576]), TensorSpec("state", "float32", [2, 1, 128]),
             TensorSpec("sr", "int64", [])]
    assert "3 inputs (input, state, sr)" in (input_structure(voice) or "")


def test_without_golden_inputs_an_image_model_is_never_judged_on_noise(tmp_path: Path, hardware: Hardware) -> None:
    pytest.importorskip("openvino", reason="OpenVINO is not installed")
    model = conv_model(tmp_path / "conv.onnx")
    blind = select_backend(model, hardware=hardware, allowed_providers=None, golden=None, expected=None,
                           cache_dir=tmp_path / "a", time_budget_s=0.2, candidates=[OV_CPU, ORT_CPU])
    figures = {f.backend: f for f in blind.figures}
    assert figures[OV_CPU.name].status is Status.UNVERIFIED and figures[OV_CPU.name].max_rel_error is None
    assert "input 'x' of rank 4" in figures[OV_CPU.name].reason and "--golden DIR" in figures[OV_CPU.name].reason
    assert blind.backend == ORT_CPU.name and blind.decision is not None and blind.decision.rule == "only"
    golden = {"x": np.random.default_rng(3).random((1, 3, 16, 16), dtype=np.float32)}
    checked = select_backend(model, hardware=hardware, allowed_providers=None, golden=golden, expected=None,
                             cache_dir=tmp_path / "b", time_budget_s=0.2, candidates=[OV_CPU, ORT_CPU])
    assert {f.status for f in checked.figures} == {Status.OK}
    flat = select_backend(affine_model(tmp_path / "affine.onnx"), hardware=hardware, allowed_providers=None,
                          golden=None, expected=None, cache_dir=tmp_path / "c", time_budget_s=0.2,
                          candidates=[OV_CPU, ORT_CPU])
    assert {f.status for f in flat.figures} == {Status.OK}  # a flat float vector: noise is a fair sample of it


def test_a_runtime_that_aborts_on_the_model_fails_its_candidate_in_a_child(tmp_path: Path, hardware: Hardware) -> None:
    """In this process OpenVINO's abort would end the test run; measured in a child it is one failed candidate."""
    pytest.importorskip("openvino", reason="OpenVINO is not installed")
    progress: list[str] = []
    selection = select_backend(string_echo(tmp_path / "echo.onnx"), hardware=hardware, allowed_providers=None,
                               golden={"text": np.array(["cat", "dog"])}, expected=None, cache_dir=tmp_path,
                               time_budget_s=0.2, progress=progress.append)
    figures = {f.backend: f for f in selection.figures}
    crashed = figures[OV_CPU.name]
    assert (crashed.status, crashed.signal) == (Status.FAILED, "SIGABRT"), crashed
    assert crashed.reason.startswith("crashed (SIGABRT) while closing") and "invalid pointer" in crashed.reason
    assert selection.backend == ORT_CPU.name and figures[ORT_CPU.name].status is Status.OK
    assert selection.to_dict()["figures"][[f.backend for f in selection.figures].index(OV_CPU.name)]["signal"] == "SIGABRT"
    assert any("openvino/CPU crashed (SIGABRT)" in line for line in progress)
    again = select_backend(tmp_path / "echo.onnx", hardware=hardware, allowed_providers=None,
                           golden={"text": np.array(["cat", "dog"])}, expected=None, cache_dir=tmp_path)
    assert again.cached and again.backend == ORT_CPU.name  # the crash is remembered with the decision


def test_a_model_the_reference_backend_cannot_run_is_a_model_error(tmp_path: Path, hardware: Hardware) -> None:
    with pytest.raises(ModelError, match=r"the reference backend cannot run the golden inputs: input 'x' expects shape"):
        select_backend(conv_model(tmp_path / "conv.onnx"), hardware=hardware, allowed_providers=None,
                       golden={"x": np.zeros((1, 3, 7, 7), np.float32)}, expected=None, cache_dir=tmp_path,
                       time_budget_s=0.2)
