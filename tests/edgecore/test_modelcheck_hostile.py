"""More hostile models for load_model_checked: odd external-data references, hidden subgraphs, fuzzed bytes.

Each must end in one ModelError line; nothing else may escape (a crash here is a crash on the device).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from edgecore.errors import ModelError
from tests.edgecore.test_modelcheck import LOADERS, _external, _model, _write

EXAMPLES = int(os.environ.get("EDGE_FUZZ_EXAMPLES", "150"))


def _loop(d: Path) -> Path:
    path = _external(d, location="loop")
    os.symlink("loop2", path.parent / "loop")
    os.symlink("loop", path.parent / "loop2")
    return path


def _subgraph_with(node: onnx.NodeProto) -> bytes:
    """A model whose only suspicious node hides in the then-branch of an If."""
    branch = helper.make_graph([node], "then", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    zero = helper.make_node("Constant", [], ["y"], value=helper.make_tensor("c", TensorProto.FLOAT, [1], [0.0]))
    other = helper.make_graph([zero], "else", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    top = helper.make_node("If", ["cond"], ["y"], then_branch=branch, else_branch=other)
    graph = helper.make_graph([top], "g", [helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    data: bytes = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
    return data


def _ir_too_new(d: Path) -> Path:
    model = _model()
    model.ir_version = onnx.IR_VERSION + 5
    return _write(d, model.SerializeToString())


def _negative_dim(d: Path) -> Path:
    model = _model()
    model.graph.initializer[0].ClearField("raw_data")
    model.graph.initializer[0].dims[:] = [4, -4]
    return _write(d, model.SerializeToString())


CASES: dict[str, tuple[Callable[[Path], Path], str]] = {
    "nul-byte": (lambda d: _external(d, location="w\x00.bin"), "NUL byte"),
    "windows-absolute": (lambda d: _external(d, location="C:\\w.bin"), "is absolute"),
    "backslash-dotdot": (lambda d: _external(d, location="..\\w.bin"), "contains '..'"),
    "inner-dotdot": (lambda d: _external(d, location="sub/../w.bin"), "contains '..'"),
    "empty-location": (lambda d: _external(d, location=""), "has no location"),
    "directory": (lambda d: _external(d, location="."), "not a file"),
    "overlong-name": (lambda d: _external(d, location="a" * 5000), "cannot be resolved"),
    "symlink-loop": (_loop, "cannot be resolved"),
    "huge-length": (lambda d: _external(d, length=str(2**62)), "beyond the end"),
    "huge-offset": (lambda d: _external(d, offset=str(2**64)), "beyond the end"),
    "negative-length": (lambda d: _external(d, length="-1"), "negative"),
    "offset-not-int": (lambda d: _external(d, offset="1e3"), "not an integer"),
    "ir-too-new": (_ir_too_new, "newer than this onnx"),
    "negative-dim": (_negative_dim, "negative dimension"),
    "unknown-domain-in-subgraph": (lambda d: _write(d, _subgraph_with(helper.make_node("Evil", [], ["y"], domain="evil.corp"))),
                                   "unknown domain"),
    "empty-file": (lambda d: _write(d, b""), "not an ONNX model"),
}


@pytest.mark.parametrize("loader", list(LOADERS))
@pytest.mark.parametrize("case", list(CASES))
def test_hostile_models_are_refused_with_one_line(case: str, loader: str, tmp_path: Path) -> None:
    make, fragment = CASES[case]
    with pytest.raises(ModelError) as info:
        LOADERS[loader](make(tmp_path))
    assert fragment in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("loader", list(LOADERS))
def test_external_data_over_the_size_limit_is_refused_before_reading(loader: str, tmp_path: Path) -> None:
    path = _external(tmp_path)
    limit = path.stat().st_size + 10  # the model fits, model plus its 64 external bytes does not
    with pytest.raises(ModelError, match="plus external data"):
        LOADERS[loader](path, max_bytes=limit)


VALID = _model(np.arange(16, dtype=np.float32).reshape(4, 4)).SerializeToString()


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(raw=st.binary(max_size=400) | st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 255)), max_size=6)
       .map(lambda flips: _flip(VALID, flips)) | st.integers(0, len(VALID)).map(lambda n: VALID[:n]))
def test_fuzzed_model_bytes_raise_only_model_errors(raw: bytes) -> None:
    for load in LOADERS.values():
        with tempfile.TemporaryDirectory() as tmp, contextlib.suppress(ModelError):
            load(_write(Path(tmp), raw))


def _flip(data: bytes, flips: list[tuple[int, int]]) -> bytes:
    out = bytearray(data)
    for index, value in flips:
        out[index] = value
    return bytes(out)
