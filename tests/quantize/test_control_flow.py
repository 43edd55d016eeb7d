"""Models with control flow and old-IR exports: weights inside If branches, keep-float across an If, IR 3 inputs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from rich.console import Console

from edgecore.errors import ModelError
from quantize import Mode, QuantizeRequest
from quantize.passes import convert_fp16, fp16_block_list
from quantize.pipeline import attempt_quantize
from quantize.recipe import CpuFeatures, Family, recipe_for
from quantize.rules import weight_tensors
from tests.quantize.models import save, tiny_cnn

SHARED = Path(__file__).resolve().parents[3] / "shared" / "models"
SILERO_V5 = SHARED / "silero-vad" / "silero_vad.onnx"
SILERO_V31 = SHARED / "silero-vad" / "silero_vad_v3.1_2021_with_attention.onnx"
MNIST = SHARED / "mnist8-modelzoo" / "mnist-8.onnx"


def _const(name: str, array: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], f"const_{name}", value=numpy_helper.from_array(array, name))


def weights_in_if() -> onnx.ModelProto:
    """silero-vad v5's trait: the top-level graph has no weight; each If branch holds its own (Constant nodes)."""
    rng = np.random.default_rng(0)
    branches = []
    for tag in ("then", "else"):
        w = rng.normal(0, 0.5, (8, 4)).astype(np.float32)
        branches.append(helper.make_graph(
            [_const(f"w_{tag}", w), helper.make_node("MatMul", ["x", f"w_{tag}"], [f"y_{tag}"], f"mm_{tag}")],
            tag, [], [helper.make_tensor_value_info(f"y_{tag}", TensorProto.FLOAT, [1, 4])]))
    node = helper.make_node("If", ["cond"], ["y"], "if0", then_branch=branches[0], else_branch=branches[1])
    graph = helper.make_graph([node], "weights_in_if",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8]),
                               helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def if_reads_outer() -> onnx.ModelProto:
    """silero-vad v3.1's trait: a branch reads a top-level tensor (`p`, from a Conv) that the If does not list."""
    rng = np.random.default_rng(1)
    axes = numpy_helper.from_array(np.array([0], np.int64), "axes")
    then = helper.make_graph([helper.make_node("Squeeze", ["p", "axes"], ["s"], "squeeze")], "then", [],
                             [helper.make_tensor_value_info("s", TensorProto.FLOAT, None)], [axes])
    other = helper.make_graph([helper.make_node("Identity", ["p"], ["i"], "identity")], "else", [],
                              [helper.make_tensor_value_info("i", TensorProto.FLOAT, None)])
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.normal(0, 0.3, (4, 4, 1, 1)).astype(np.float32), "w2")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["p"], "conv", pads=[1, 1, 1, 1]),
             helper.make_node("If", ["cond"], ["q"], "if0", then_branch=then, else_branch=other),
             helper.make_node("Conv", ["p", "w2"], ["y"], "conv2")]
    graph = helper.make_graph(nodes, "if_reads_outer",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8]),
                               helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8]),
                               helper.make_tensor_value_info("q", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def initializers_as_inputs() -> onnx.ModelProto:
    """mnist-8's trait (IR 3): every initializer is also listed as a graph input."""
    model = tiny_cnn()
    for init in model.graph.initializer:
        model.graph.input.append(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    model.ir_version = 3
    return model


def _request(model: Path, target: str, tmp: Path, **kw: Any) -> QuantizeRequest:
    return QuantizeRequest(model=model, target=target, output=tmp / "out.onnx", measure=False, max_drop=100.0,
                           min_db=-100.0, **kw)


def _fp16_weights(model: onnx.ModelProto) -> int:
    return sum(t.data_type == TensorProto.FLOAT16 for _, t in weight_tensors(model.graph))


def _silero_calib(tmp: Path, v5: bool) -> Path:
    folder = tmp / "calib"
    folder.mkdir()
    for seed in range(4):
        audio = np.random.default_rng(seed).uniform(-0.5, 0.5, (1, 576 if v5 else 1536)).astype(np.float32)
        state = ({"state": np.zeros((2, 1, 128), np.float32), "sr": np.array(16000, np.int64)} if v5
                 else {"h0": np.zeros((2, 1, 64), np.float32), "c0": np.zeros((2, 1, 64), np.float32)})
        np.savez(folder / f"{seed:03d}.npz", input=audio, **state)
    return folder


# -- weights only inside If branches (silero-vad v5) ----------------------------------------------------------


def test_int8_of_weights_only_in_branches_is_refused_naming_why(tmp_path: Path) -> None:
    path = save(weights_in_if(), tmp_path / "m.onnx")
    with pytest.raises(ModelError, match="every float32 weight is inside control-flow subgraphs"):
        attempt_quantize(_request(path, "jetson-orin", tmp_path, calib_synthetic=4))


def test_auto_on_cpu_keeps_float_and_says_int8_cannot_reach_branches(tmp_path: Path) -> None:
    path = save(weights_in_if(), tmp_path / "m.onnx")
    outcome = attempt_quantize(_request(path, "cpu-x86", tmp_path, calib_synthetic=4))
    assert outcome.written and outcome.report.data["chosen"] == "float"
    assert any("INT8 not built" in n for n in outcome.report.data["notes"])


@pytest.mark.parametrize("target", ["cpu-x86", "jetson-orin"])
def test_fp16_reaches_weights_in_branches(tmp_path: Path, target: str) -> None:
    """The format check counts float16 weights in branches (it looked at top-level initializers: exit 1)."""
    path = save(weights_in_if(), tmp_path / "m.onnx")
    outcome = attempt_quantize(_request(path, target, tmp_path, mode=Mode.FP16))
    assert outcome.written and outcome.report.data["chosen"] == "fp16"
    assert outcome.report.model is not None and _fp16_weights(outcome.report.model) == 2


def test_a_model_without_any_float_weight_is_still_refused(tmp_path: Path) -> None:
    model = weights_in_if()
    for branch in (a.g for a in model.graph.node[0].attribute):
        for node in branch.node:
            if node.op_type == "Constant":
                node.attribute[0].t.CopyFrom(numpy_helper.from_array(np.ones((8, 4), np.int32), node.output[0]))
            if node.op_type == "MatMul":  # int32 x int32, so that onnxruntime loads the model
                node.input[0] = "x_int"
    model.graph.node.insert(0, helper.make_node("Cast", ["x"], ["x_int"], "to_int", to=TensorProto.INT32))
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.INT32
    for branch in (a.g for a in model.graph.node[1].attribute):
        branch.output[0].type.tensor_type.elem_type = TensorProto.INT32
    path = save(model, tmp_path / "m.onnx")
    with pytest.raises(ModelError, match="no float32 weights to quantize"):
        attempt_quantize(_request(path, "coreml-mlprogram", tmp_path))


@pytest.mark.skipif(not SILERO_V5.exists(), reason=f"{SILERO_V5} not present (shared models not mounted)")
@pytest.mark.parametrize("target,chosen", [("cpu-x86", "float"), ("coreml-mlprogram", "fp16")])
def test_silero_v5(tmp_path: Path, target: str, chosen: str) -> None:
    """Its untaken 8 kHz branch cannot take a fixed 1x576 input: the input stays dynamic, and says so."""
    outcome = attempt_quantize(_request(SILERO_V5, target, tmp_path, calib_dir=_silero_calib(tmp_path, True)))
    assert outcome.written and outcome.report.data["chosen"] == chosen
    assert any("inputs kept dynamic" in n for n in outcome.report.data["notes"])


# -- keep-float across an If boundary (silero-vad v3.1 on myriad) ---------------------------------------------


def test_fp16_block_list_converts_an_if_whose_branches_read_outer_floats() -> None:
    model = if_reads_outer()
    assert fp16_block_list(model.graph, {"conv", "if0", "squeeze"}) == {"conv"}


def test_fp16_with_the_producer_and_the_if_kept_float_loads_in_onnxruntime() -> None:
    model = if_reads_outer()
    recipe = recipe_for("fp16", Family.CPU, CpuFeatures(frozenset()))
    converted = convert_fp16(model, recipe, {"conv", "if0"})
    session = ort.InferenceSession(converted.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
    for cond in (True, False):
        y, q = session.run(None, {"x": x, "cond": np.array(cond)})
        assert y.shape == (1, 4, 8, 8) and q.size == 4 * 8 * 8


@pytest.mark.skipif(not SILERO_V31.exists(), reason=f"{SILERO_V31} not present (shared models not mounted)")
def test_silero_v31_for_myriad_keeps_float_when_the_ir_needs_a_newer_openvino(tmp_path: Path) -> None:
    """OpenVINO here writes Pad-12/Identity-16 for it, which the 2022.3 runtime MYRIAD needs cannot read."""
    outcome = attempt_quantize(_request(SILERO_V31, "myriad", tmp_path, calib_dir=_silero_calib(tmp_path, False)),
                               Console(quiet=True))
    assert outcome.written and outcome.report.data["chosen"] == "float"
    fp16 = next(v for v in outcome.report.data["variants"] if v["name"] == "fp16")
    assert fp16["recipe"]["container"] == "openvino-ir" and "OpenVINO 2022.3" in fp16["problems"][0]
    assert any("auto: kept the float model because fp16 cannot be written" in n for n in outcome.report.data["notes"])


# -- initializers listed as inputs (mnist-8, IR 3) ------------------------------------------------------------


def test_fp16_converts_weights_listed_as_graph_inputs(tmp_path: Path) -> None:
    path = save(initializers_as_inputs(), tmp_path / "m.onnx")
    outcome = attempt_quantize(_request(path, "coreml-mlprogram", tmp_path))
    assert outcome.written and outcome.report.data["chosen"] == "fp16"
    assert outcome.report.model is not None and _fp16_weights(outcome.report.model) == 6
    assert [i.name for i in outcome.report.model.graph.input] == ["x"]


@pytest.mark.skipif(not MNIST.exists(), reason=f"{MNIST} not present (shared models not mounted)")
def test_mnist8_for_coreml_is_written_in_fp16(tmp_path: Path) -> None:
    outcome = attempt_quantize(_request(MNIST, "coreml-mlprogram", tmp_path))
    assert outcome.written and outcome.report.data["chosen"] == "fp16"
    assert outcome.report.model is not None and _fp16_weights(outcome.report.model) > 0
