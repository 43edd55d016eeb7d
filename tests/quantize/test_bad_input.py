"""Bad input is refused with a one-line message that names the problem; nothing is written at OUT."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from rich.console import Console

from edgecore.errors import ModelError, UserError
from quantize import Mode, QuantizeRequest, run_quantize
from tests.quantize.models import save, sensitive_mlp


def _request(model: Path, calib: Path, tmp: Path, preprocess: Path | None = None) -> QuantizeRequest:
    return QuantizeRequest(model=model, target="cpu-x86", output=tmp / "out.onnx", mode=Mode.INT8,
                           calib_dir=calib, measure=False, preprocess=preprocess)


CalibFile = bytes | np.ndarray | dict[str, np.ndarray]  # raw bytes, one .npy array, or the arrays of one .npz


def _folder(tmp: Path, files: dict[str, CalibFile]) -> Path:
    folder = tmp / "bad"
    folder.mkdir()
    for name, value in files.items():
        if isinstance(value, bytes):
            (folder / name).write_bytes(value)
        elif isinstance(value, dict):
            np.savez(folder / name, allow_pickle=True, **value)  # numpy's default, named so **value cannot match it
        else:
            np.save(folder / name, value)
    return folder


@pytest.mark.parametrize("files,message", [
    ({"a.npy": np.zeros((1, 3, 8, 8), np.float32)}, r"input 'x' expects \[1,3,16,16\] float32, got \[1,3,8,8\]"),
    ({"a.npy": np.zeros((1, 3, 16, 16), np.float64)}, r"input 'x' expects \[1,3,16,16\] float32, got .*float64"),
    ({"a.npz": {"image": np.zeros((1, 3, 16, 16), np.float32)}}, r"no array for input 'x' \(expected \[1,3,16,16\]"),
    ({"a.png": b"not a png at all"}, r"a.png: unreadable image"),
    ({"a.npy": b"garbage"}, r"a.npy: unreadable array file"),
], ids=["shape", "dtype", "input-name", "unreadable-image", "unreadable-npy"])
def test_bad_calibration_sample_names_input_and_shape(cnn_path: Path, tmp_path: Path, files: dict[str, CalibFile],
                                                      message: str) -> None:
    with pytest.raises(UserError, match=message):
        run_quantize(_request(cnn_path, _folder(tmp_path, files), tmp_path), Console(quiet=True))


def test_empty_calibration_folder(cnn_path: Path, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="empty calibration folder"):
        run_quantize(_request(cnn_path, tmp_path / "empty", tmp_path), Console(quiet=True))


def test_images_with_preprocessing_yaml(cnn_path: Path, tmp_path: Path) -> None:
    folder = tmp_path / "imgs"
    folder.mkdir()
    for i in range(3):
        Image.fromarray(np.full((40, 30, 3), 40 * i, np.uint8)).save(folder / f"{i}.jpg")
    prep = tmp_path / "prep.yaml"
    prep.write_text("inputs:\n  x:\n    channel_order: BGR\n    mean: [127, 127, 127]\n    std: [128, 128, 128]\n")
    report = run_quantize(_request(cnn_path, folder, tmp_path, preprocess=prep), Console(quiet=True))
    assert report.data["chosen"] == "int8"
    prep.write_text("inputs:\n  x:\n    colour: RGB\n")
    with pytest.raises(UserError, match=r"unknown key inputs.x.colour"):
        run_quantize(_request(cnn_path, folder, tmp_path, preprocess=prep), Console(quiet=True))


def test_already_quantized_model_refused(cnn_path: Path, cnn_calib: Path, tmp_path: Path) -> None:
    report = run_quantize(_request(cnn_path, cnn_calib, tmp_path), Console(quiet=True))
    report.write(tmp_path / "q.onnx", tmp_path / "q.json", None)
    with pytest.raises(ModelError, match="already quantized"):
        run_quantize(_request(tmp_path / "q.onnx", cnn_calib, tmp_path), Console(quiet=True))


def test_unmeetable_budget_exits_5_with_best_figure_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out.onnx"
    mlp_path = save(sensitive_mlp(regression=True), tmp_path / "mlp.onnx")
    # SQNR: INT8 never comes within float noise (90 dB) of the float model, so --min-db 90 cannot be met
    proc = subprocess.run(
        [sys.executable, "-m", "edgectl.cli.main", "quantize", str(mlp_path), "--target", "jetson-orin",
         "--mode", "int8", "-o", str(out), "--calib-synthetic", "16", "--min-db", "90", "--no-measure"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 5, proc.stderr
    said = " ".join(proc.stderr.split())
    assert "accuracy budget not met: int8 y: SQNR" in said and "< --min-db 90" in said and "nothing written" in said
    assert not out.exists() and not list(tmp_path.glob(".out.onnx*")) and not (tmp_path / "out.quant.json").exists()


def test_target_that_runs_no_onnx_is_refused_with_the_way_out(cnn_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.onnx"
    proc = subprocess.run(
        [sys.executable, "-m", "edgectl.cli.main", "quantize", str(cnn_path), "--target", "edgetpu", "-o", str(out)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot run ONNX models" in lines[0] and "targets show edgetpu" in lines[0]
    assert not out.exists()
