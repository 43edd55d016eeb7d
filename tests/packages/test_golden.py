"""`edgectl build --golden DIR --input-shape NAME=...`: golden data in the shape the model really takes."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.fleet import EdgectlHome


def dynamic_model(path: Path) -> Path:
    """Relu over a fully dynamic image, [N,3,H,W], as exported detectors and OCR models take it."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["image"], ["out"])], "dynamic",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, "H", "W"])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 3, "H", "W"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def golden_of(package: Path) -> dict[str, np.ndarray]:
    """The golden arrays inside a package (payload.tar inside the .edgepkg)."""
    with tarfile.open(package) as outer:
        payload = outer.extractfile("payload.tar")
        assert payload is not None
        with tarfile.open(fileobj=io.BytesIO(payload.read())) as inner:
            golden = inner.extractfile("golden.npz")
            assert golden is not None
            with np.load(io.BytesIO(golden.read())) as data:
                return {k: data[k] for k in data.files}


def _build(home: EdgectlHome, model: Path, out: Path, *extra: str) -> tuple[int, list[str]]:
    result = home.edgectl("build", str(model), "--name", "m", "--version", "1", "-o", str(out), *extra)
    return result.returncode, result.stderr.strip().splitlines()


def test_a_fully_dynamic_input_is_refused_naming_the_flag(tmp_path: Path, offline_home: EdgectlHome) -> None:
    code, lines = _build(offline_home, dynamic_model(tmp_path / "d.onnx"), tmp_path / "d.edgepkg")
    assert code == 2 and len(lines) == 1, lines
    assert "--input-shape image=1x3xHxW" in lines[0] and "--golden DIR" in lines[0], lines
    assert not (tmp_path / "d.edgepkg").exists()


def test_input_shape_sets_the_golden_input(tmp_path: Path, offline_home: EdgectlHome) -> None:
    out = tmp_path / "d.edgepkg"
    code, lines = _build(offline_home, dynamic_model(tmp_path / "d.onnx"), out, "--input-shape", "image=1x3x64x48")
    assert code == 0, lines
    golden = golden_of(out)
    assert golden["input:image"].shape == (1, 3, 64, 48)
    np.testing.assert_array_equal(golden["output:out"], np.maximum(golden["input:image"], 0))
    assert offline_home.edgectl("verify", str(out)).returncode == 0


def test_golden_dir_samples_become_the_golden_data(tmp_path: Path, offline_home: EdgectlHome) -> None:
    samples = tmp_path / "samples"
    samples.mkdir()
    rng = np.random.default_rng(1)
    first, second = rng.standard_normal((1, 3, 20, 30)).astype(np.float32), rng.standard_normal((3, 20, 30)).astype(np.float32)
    np.save(samples / "a.npy", first)
    np.savez(samples / "b.npz", image=second)  # without its batch axis, as --calib accepts
    out = tmp_path / "d.edgepkg"
    code, lines = _build(offline_home, dynamic_model(tmp_path / "d.onnx"), out, "--golden", str(samples), "--golden-samples", "2")
    assert code == 0, lines
    golden = golden_of(out)
    np.testing.assert_array_equal(golden["input:image"], np.concatenate([first, second[None]]))
    np.testing.assert_array_equal(golden["output:out"], np.maximum(golden["input:image"], 0))


@pytest.mark.parametrize(("flags", "words"), [
    (["--input-shape", "image=1x3x64"], "does not fit"),
    (["--input-shape", "image=1x3xbigx4"], "expected NAME=DxDx"),
    (["--input-shape", "photo=1x3x8x8"], "the model's inputs are image"),
    (["--golden", "{empty}"], "no .npy"),
    (["--golden", "{mismatch}", "--input-shape", "image=1x3x16x16"], "expects [1,3,16,16]"),
])
def test_bad_golden_flags_exit_2_with_one_line(tmp_path: Path, offline_home: EdgectlHome, flags: list[str], words: str) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "mismatch").mkdir()
    np.save(tmp_path / "mismatch" / "a.npy", np.zeros((1, 3, 8, 8), np.float32))
    flags = [f.format(empty=tmp_path / "empty", mismatch=tmp_path / "mismatch") for f in flags]
    code, lines = _build(offline_home, dynamic_model(tmp_path / "d.onnx"), tmp_path / "d.edgepkg", *flags)
    assert code == 2 and len(lines) == 1 and words in lines[0], lines
