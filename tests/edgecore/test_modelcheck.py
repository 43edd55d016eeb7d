"""load_model_checked refuses hostile or broken models with one line, before reading big data."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgecore.errors import ModelError
from edgecore.modelcheck import check_model, check_model_file, load_model_checked

# Every refusal holds on both paths: the host's (onnx) and the device's (protobuf subset, onnxruntime's limits).
LOADERS: dict[str, Callable[..., object]] = {"host": load_model_checked, "device": check_model_file}


def _model(weight: np.ndarray | None = None, domain: str = "", opset: int = 17) -> onnx.ModelProto:
    weight = np.ones((4, 4), np.float32) if weight is None else weight
    node = helper.make_node("MatMul", ["x", "w"], ["y"], name="mm", domain=domain)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
                              [numpy_helper.from_array(weight, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _external(tmp_path: Path, **fields: str) -> Path:
    """A model whose weight lives in w.bin, with external_data fields overridden."""
    path = tmp_path / "m" / "model.onnx"
    path.parent.mkdir(exist_ok=True)
    onnx.save(_model(), str(path), save_as_external_data=True, location="w.bin", size_threshold=0)
    model = onnx.load(str(path), load_external_data=False)
    entries = model.graph.initializer[0].external_data
    for key, value in fields.items():
        match = [e for e in entries if e.key == key]
        (match[0] if match else entries.add()).key = key
        (match[0] if match else next(e for e in entries if e.key == key)).value = value
    path.write_bytes(model.SerializeToString())
    return path


def test_good_model_and_external_data_load(tmp_path: Path) -> None:
    path = _external(tmp_path)
    model = load_model_checked(path)
    assert numpy_helper.to_array(model.graph.initializer[0]).sum() == 16
    assert check_model(model).graph.value_info is not None


CASES: dict[str, tuple[Callable[[Path], Path], str]] = {
    "missing": (lambda d: d / "nope.onnx", "not a file"),
    "garbage": (lambda d: _write(d, b"\xff\xfe garbage" * 50), "not an ONNX model"),
    "truncated": (lambda d: _write(d, _model().SerializeToString()[:60]), "not an ONNX model"),
    "other-message": (lambda d: _write(d, numpy_helper.from_array(np.ones(3, np.float32)).SerializeToString()),
                      "not an ONNX model"),
    "opset-too-new": (lambda d: _write(d, _model(opset=99).SerializeToString()), "newer than this onnx"),
    "unknown-domain": (lambda d: _write(d, _model(domain="evil.corp").SerializeToString()), "unknown domain"),
    "absolute": (lambda d: _external(d, location="/etc/passwd"), "is absolute"),
    "dotdot": (lambda d: _external(d, location="../w.bin"), "contains '..'"),
    "offset-negative": (lambda d: _external(d, offset="-8"), "negative"),
    "beyond-file": (lambda d: _external(d, offset="1000000", length="64"), "beyond the end"),
}


def _write(directory: Path, data: bytes) -> Path:
    path = directory / "model.onnx"
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("loader", list(LOADERS))
@pytest.mark.parametrize("case", list(CASES))
def test_bad_models_are_refused_with_one_line(case: str, loader: str, tmp_path: Path) -> None:
    make, fragment = CASES[case]
    with pytest.raises(ModelError) as info:
        LOADERS[loader](make(tmp_path))
    assert fragment in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("loader", list(LOADERS))
def test_symlink_and_hardlink_out_of_the_directory_are_refused(loader: str, tmp_path: Path) -> None:
    path = _external(tmp_path)
    outside = tmp_path / "secret.bin"
    (path.parent / "w.bin").rename(outside)
    (path.parent / "w.bin").symlink_to(outside)
    with pytest.raises(ModelError, match="outside the model directory"):
        LOADERS[loader](path)
    (path.parent / "w.bin").unlink()
    os.link(outside, path.parent / "w.bin")
    with pytest.raises(ModelError, match="hard link"):
        LOADERS[loader](path)


@pytest.mark.parametrize("loader", list(LOADERS))
def test_too_large_and_absurd_dims_are_refused(loader: str, tmp_path: Path) -> None:
    path = _write(tmp_path, _model().SerializeToString())
    with pytest.raises(ModelError, match="larger than the limit"):
        LOADERS[loader](path, max_bytes=10)
    model = _model()
    model.graph.initializer[0].ClearField("raw_data")
    model.graph.initializer[0].dims[:] = [2**20, 2**12]
    with pytest.raises(ModelError, match="elements"):
        LOADERS[loader](_write(tmp_path, model.SerializeToString()))


def test_check_model_translates_checker_errors() -> None:
    model = _model()
    model.graph.node[0].input.append("undefined_tensor")
    with pytest.raises(ModelError, match="ONNX checker"):
        check_model(model)
