"""One synthetic-input helper and one output-comparison policy (by the model's precision)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgecore.backends import TensorSpec
from edgecore.errors import ModelError
from edgecore.tensors import agreeing_rows, compare_outputs, synthetic_feeds

SPECS = [TensorSpec("image", "float32", ["batch", 3, 4, 4]), TensorSpec("ids", "int64", [None, 5]),
         TensorSpec("mask", "bool", [2]), TensorSpec("text", "object", [1])]


def test_synthetic_feeds_are_deterministic_and_in_range() -> None:
    feeds = synthetic_feeds(SPECS)
    assert {k: (v.shape, v.dtype.kind) for k, v in feeds.items()} == {
        "image": ((1, 3, 4, 4), "f"), "ids": ((1, 5), "i"), "mask": ((2,), "b"), "text": ((1,), "U")}
    assert feeds["image"].min() >= 0 and feeds["image"].max() < 1  # safe for sqrt and log
    assert feeds["ids"].min() >= 0 and feeds["ids"].max() < 10
    again = synthetic_feeds(SPECS)
    assert all(np.array_equal(feeds[k], again[k]) for k in feeds)


def test_synthetic_feeds_like_golden_take_its_shapes() -> None:
    golden = {"image": np.zeros((4, 3, 4, 4), np.float16)}
    feeds = synthetic_feeds(SPECS, np.random.default_rng(3), like=golden)
    assert set(feeds) == {"image"} and feeds["image"].shape == (4, 3, 4, 4) and feeds["image"].dtype == np.float16


@pytest.mark.parametrize(("precision", "error", "ok"), [
    ("fp32", 5e-4, True), ("fp32", 5e-3, False), ("fp16", 1e-2, True), ("fp16", 5e-2, False), ("int8", 5e-2, True)])
def test_float_outputs_compare_by_model_precision(precision: str, error: float, ok: bool) -> None:
    want = {"y": np.array([[2.0, -1.0]], np.float32)}
    got = {"y": want["y"] + np.float32(2.0 * error)}
    check = compare_outputs(got, want, precision)
    assert (check.problem is None) is ok
    assert check.max_rel_error == pytest.approx(error, rel=1e-3)


def test_integer_outputs_and_missing_outputs() -> None:
    want = {"label": np.arange(100)}
    off_one = {"label": np.where(np.arange(100) == 0, 7, np.arange(100))}
    assert compare_outputs(off_one, want, "fp32").problem == "output 'label' differs on 1.0% of elements"
    assert compare_outputs(off_one, want, "fp16").problem is None
    assert compare_outputs({}, want, "fp32").problem == "output 'label' is missing"
    with pytest.raises(ModelError, match="unknown model precision 'int4'"):
        compare_outputs(want, want, "int4")


def test_agreeing_rows_use_the_same_tolerance() -> None:
    a = np.array([[10.0], [20.0]], np.float32)
    assert agreeing_rows(a, a + np.float32(0.01), "fp32").tolist() == [True, True]  # 0.01 of 20 is 5e-4
    assert agreeing_rows(a, a + np.float32(0.1), "fp32").tolist() == [False, False]
    assert agreeing_rows(a, a + np.float32(0.1), "fp16").tolist() == [True, True]
    nan = np.array([[np.nan], [1.0]], np.float32)
    assert agreeing_rows(nan, nan.copy(), "fp32").tolist() == [True, True]


def test_one_generator_serves_build_and_probe_shapes() -> None:
    """edgecore.feeds (build's golden inputs, probe --input-shape) draws from edgecore.tensors, only adding given shapes."""
    from edgecore import feeds

    specs = [TensorSpec("x", "float32", [None, 3, "h", "w"]), TensorSpec("n", "int64", [1])]
    shapes = {"x": (2, 3, 8, 8)}
    built = feeds.synthetic_feeds(specs, shapes, seed=5)
    assert {k: v.shape for k, v in built.items()} == {"x": (2, 3, 8, 8), "n": (1,)}
    for name, value in synthetic_feeds(specs, 5, shapes=shapes).items():
        np.testing.assert_array_equal(built[name], value)
    assert built["x"].min() >= 0 and built["x"].max() < 1
    text = feeds.synthetic_feeds([TensorSpec("s", "object", ["n"])], {"s": (6,)})["s"]
    assert text.dtype.kind == "U" and text.shape == (6,) and set(text.tolist()) <= set("abcdefghij")


def test_synthetic_strings_are_u_arrays_that_npz_keeps_and_onnxruntime_takes(tmp_path: Path) -> None:
    """Golden strings are stored without pickle (``U``), and onnxruntime runs them (it refuses ``S``)."""
    import onnxruntime as ort

    from tests.e2e.test_deploy_strings import words_model

    feeds = synthetic_feeds([TensorSpec("text", "object", ["N"])], 1, shapes={"text": (8,)})
    np.savez(tmp_path / "g.npz", allow_pickle=False, **feeds)
    with np.load(tmp_path / "g.npz", allow_pickle=False) as data:
        loaded = data["text"]
    assert loaded.dtype.kind == "U" and loaded.tolist() == feeds["text"].tolist()
    session = ort.InferenceSession(str(words_model(tmp_path / "w.onnx")), providers=["CPUExecutionProvider"])
    echo = session.run(["echo"], {"text": loaded})[0]
    assert echo.dtype == object and compare_outputs({"echo": echo}, {"echo": loaded}, "fp32").problem is None
    again = synthetic_feeds([TensorSpec("text", "object", ["N"])], np.random.default_rng(3), like={"text": loaded})
    assert again["text"].dtype.kind == "U" and again["text"].shape == (8,)


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_string_outputs_compare_exactly_whatever_the_precision(precision: str) -> None:
    want = {"name": np.array(["CAT", "DOG", "café", ""])}  # golden data: U
    got = {"name": np.array(["CAT", "DOG", "café", ""], dtype=object)}  # what a runtime returns
    assert compare_outputs(got, want, precision).problem is None
    got["name"][2] = "cafe"
    assert compare_outputs(got, want, precision).problem == "output 'name' differs on 25.0% of its strings"
    assert compare_outputs({"name": np.zeros(4)}, want, precision).problem == "output 'name' differs on 100.0% of its strings"
    assert compare_outputs({"name": np.array([b"CAT", b"DOG", "café".encode(), b""], dtype=object)}, want,
                           precision).problem is None


def test_string_rows_agree_on_equal_text() -> None:
    a = np.array([["x", "y"], ["z", "w"]], dtype=object)
    assert agreeing_rows(a, np.array([["x", "y"], ["z", "W"]]), "int8").tolist() == [True, False]
