"""The device reads models without onnx: what it reads matches onnx's reading, and nothing hides from its checks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgecore.errors import ModelError
from edgecore.feeds import graph_inputs, model_inputs
from edgecore.modelcheck import check_model_file, onnxruntime_limits
from edgecore.tensors import model_precision
from tests.edgecore.test_modelcheck import _model, _write

MODELS = Path(__file__).resolve().parents[3] / "shared" / "models"


def _field(number: int, payload: bytes) -> bytes:
    """One length-delimited protobuf field (wire type 2)."""
    tag, size = (number << 3) | 2, len(payload)
    return _varint(tag) + _varint(size) + payload


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def test_a_graph_split_over_two_fields_is_merged_so_a_node_cannot_hide(tmp_path: Path) -> None:
    evil = helper.make_graph([helper.make_node("Evil", [], ["z"], domain="evil.corp")], "g", [], [])
    data = _model().SerializeToString() + _field(7, evil.SerializeToString())  # field 7: ModelProto.graph, again
    merged = onnx.ModelProto()
    merged.ParseFromString(data)
    assert [n.op_type for n in merged.graph.node] == ["MatMul", "Evil"]  # onnx (and onnxruntime) merge the two
    with pytest.raises(ModelError, match=r"unknown domain 'evil\.corp'"):
        check_model_file(_write(tmp_path, data))


def test_a_name_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    model = _model()
    model.graph.node[0].domain = "placeholder"
    data = model.SerializeToString().replace(b"placeholder", b"\xff\xfeaceholder")  # same length
    with pytest.raises(ModelError, match="not UTF-8") as info:
        check_model_file(_write(tmp_path, data))
    assert "\n" not in str(info.value)


def test_the_device_limits_are_those_of_onnxruntime_itself(tmp_path: Path) -> None:
    """A model at the limits loads in onnxruntime; one IR version newer is refused by onnxruntime too."""
    limits = onnxruntime_limits()
    at_limit = _model(opset=limits.opsets[""])
    at_limit.ir_version = limits.ir_version
    path = _write(tmp_path, at_limit.SerializeToString())
    check_model_file(path)
    ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    at_limit.ir_version += 1
    newer = _write(tmp_path, at_limit.SerializeToString())
    with pytest.raises(ModelError, match="newer than this onnxruntime"):
        check_model_file(newer)
    with pytest.raises(Exception, match="IR version"):
        ort.InferenceSession(str(newer), providers=["CPUExecutionProvider"])


def _corpus(tmp_path: Path) -> list[Path]:
    strings = helper.make_graph([helper.make_node("Identity", ["s"], ["t"])], "g",
                                [helper.make_tensor_value_info("s", TensorProto.STRING, ["n", 2])],
                                [helper.make_tensor_value_info("t", TensorProto.STRING, ["n", 2])])
    half = _model(np.ones((4, 4), np.float16))
    half.graph.input[0].type.tensor_type.elem_type = TensorProto.FLOAT16
    made = [_write(tmp_path / name, m.SerializeToString()) for name, m in
            (("fp32", _model()), ("strings", helper.make_model(strings)), ("fp16", half))]
    shared = sorted(MODELS.glob("*/*.onnx")) if MODELS.is_dir() else []
    return made + shared


def test_inputs_and_precision_read_without_onnx_match_onnx(tmp_path: Path) -> None:
    for name in ("fp32", "strings", "fp16"):
        (tmp_path / name).mkdir()
    for path in _corpus(tmp_path):
        assert model_inputs(path) == graph_inputs(onnx.load(str(path), load_external_data=False)), path


def test_precision_is_read_from_the_graph(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert model_precision(_write(tmp_path / "a", _model(np.ones((4, 4), np.float16)).SerializeToString())) == "fp16"
    scale = [numpy_helper.from_array(np.array(0.1, np.float32), "s"), numpy_helper.from_array(np.array(0, np.int8), "z")]
    qdq = helper.make_graph([helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
                             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])], "g",
                            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], scale)
    assert model_precision(_write(tmp_path / "b", helper.make_model(qdq).SerializeToString())) == "int8"
    assert model_precision(_write(tmp_path, _model().SerializeToString())) == "fp32"
