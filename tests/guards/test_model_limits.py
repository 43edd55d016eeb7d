"""The model checks' limits at their edges: file size (with external data), tensor sizes, versions, external
references; each accepted exactly at the limit and refused one past it."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from edgecore.errors import ModelError
from edgecore.modelcheck import MAX_TENSOR_ELEMENTS, VersionLimits, check_model, check_model_file, load_model_checked


def _model(path: Path, initializer: TensorProto | None = None, ir: int = 8, opset: int = 17) -> Path:
    node = helper.make_node("Identity", ["x"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
                              initializer=[initializer] if initializer is not None else [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir
    path.write_bytes(model.SerializeToString())
    return path


def _declared(dims: list[int]) -> TensorProto:
    """A tensor that declares ``dims`` and carries no data: what a hostile model would claim."""
    tensor = TensorProto(name="w", data_type=TensorProto.FLOAT)
    tensor.dims.extend(dims)
    return tensor


def _external(location: str, **fields: int) -> TensorProto:
    tensor = TensorProto(name="w", data_type=TensorProto.FLOAT, data_location=TensorProto.EXTERNAL)
    tensor.dims.extend([4])
    for key, value in {"location": location, **{k: str(v) for k, v in fields.items()}}.items():
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    return tensor


LIMITS = VersionLimits("onnxruntime 9.9", 8, {"": 17, "ai.onnx": 17})


def test_a_model_file_may_be_as_large_as_the_limit(tmp_path: Path) -> None:
    path = _model(tmp_path / "m.onnx")
    size = path.stat().st_size
    check_model_file(path, max_bytes=size, limits=LIMITS)
    with pytest.raises(ModelError, match=f"{size} bytes is larger than the limit of {size - 1} bytes"):
        check_model_file(path, max_bytes=size - 1, limits=LIMITS)


def test_external_data_counts_toward_the_limit(tmp_path: Path) -> None:
    (tmp_path / "w.bin").write_bytes(b"\0" * 16)
    path = _model(tmp_path / "m.onnx", _external("w.bin"))
    total = path.stat().st_size + 16
    assert check_model_file(path, max_bytes=total, limits=LIMITS) is not None
    with pytest.raises(ModelError, match=f"model plus external data is {total} bytes, over the limit of {total - 1}"):
        check_model_file(path, max_bytes=total - 1, limits=LIMITS)
    check_model_file(path, max_bytes=total - 1, limits=LIMITS, check_external_data=False)  # not read, not counted


@pytest.mark.parametrize(("dims", "refused"), [([MAX_TENSOR_ELEMENTS], False), ([MAX_TENSOR_ELEMENTS + 1], True),
                                               ([2**30 + 1], False), ([2, 2**30], False), ([2, 2**30, 2], True),
                                               ([0, 2**40], False), ([0], False), ([-1], True), ([4, -2], True)])
def test_tensor_sizes_at_the_limit(tmp_path: Path, dims: list[int], refused: bool) -> None:
    path = _model(tmp_path / "m.onnx", _declared(dims))
    if refused:
        with pytest.raises(ModelError, match=r"negative dimension|elements \(limit 2147483648\)"):
            check_model_file(path, limits=LIMITS)
    else:
        check_model_file(path, limits=LIMITS)


def test_versions_up_to_the_runtimes_are_taken(tmp_path: Path) -> None:
    check_model_file(_model(tmp_path / "a.onnx", ir=8, opset=17), limits=LIMITS)
    with pytest.raises(ModelError, match=r"IR version 9 is newer than this onnxruntime 9\.9 supports \(8\)"):
        check_model_file(_model(tmp_path / "b.onnx", ir=9, opset=17), limits=LIMITS)
    with pytest.raises(ModelError, match=r"opset ai\.onnx 18 is newer than this onnxruntime 9\.9 supports \(17\)"):
        check_model_file(_model(tmp_path / "c.onnx", ir=8, opset=18), limits=LIMITS)


EXTERNAL = [  # file bytes, the tensor's fields, refused
    (16, {}, False),  # the whole file, from offset 0
    (16, {"offset": 16, "length": 0}, False),  # at the very end: nothing
    (16, {"offset": 17, "length": 0}, True),
    (16, {"offset": 4, "length": 12}, False),
    (16, {"offset": 4, "length": 13}, True),
    (16, {"length": 16}, False),
    (16, {"length": 17}, True),
]


@pytest.mark.parametrize(("size", "fields", "refused"), EXTERNAL, ids=[str(e[1]) for e in EXTERNAL])
def test_an_external_reference_stays_within_its_file(tmp_path: Path, size: int, fields: dict[str, int], refused: bool) -> None:
    (tmp_path / "w.bin").write_bytes(b"\0" * size)
    path = _model(tmp_path / "m.onnx", _external("w.bin", **fields))
    if refused:
        with pytest.raises(ModelError, match=r"is beyond the end of 'w\.bin'"):
            check_model_file(path, limits=LIMITS)
    else:
        check_model_file(path, limits=LIMITS)


def test_external_data_is_loaded_only_when_asked(tmp_path: Path) -> None:
    (tmp_path / "w.bin").write_bytes(b"\1\0\0\0" * 4)
    path = _model(tmp_path / "m.onnx", _external("w.bin"))
    loaded = load_model_checked(path)
    assert loaded.graph.initializer[0].raw_data == b"\1\0\0\0" * 4
    referenced = load_model_checked(path, check_external_data=False)
    tensor = referenced.graph.initializer[0]
    assert tensor.raw_data == b"" and tensor.data_location == TensorProto.EXTERNAL


def test_a_model_failing_the_checker_is_named_in_one_line(tmp_path: Path) -> None:
    model = onnx.load(str(_model(tmp_path / "m.onnx")))
    model.graph.node[0].input[0] = "missing"
    with pytest.raises(ModelError) as caught:
        check_model(model)
    message = str(caught.value)
    assert message.startswith("model fails the ONNX checker: ") and "\n" not in message
    assert "'missing'" in message  # the checker's own reason, its first line
