"""Opset upgrade before per-channel QDQ, or an explanation and a per-tensor fallback."""

from __future__ import annotations

from pathlib import Path

import onnxruntime as ort
from rich.console import Console

from quantize import Mode, QuantizeRequest, run_quantize
from quantize.opset import default_opset
from tests.quantize.models import save, tiny_cnn


def test_old_opset_raised_to_13_for_per_channel(tmp_path: Path) -> None:
    path = save(tiny_cnn(opset=9), tmp_path / "old.onnx")
    report = run_quantize(QuantizeRequest(model=path, target="cpu-x86", output=tmp_path / "o.onnx", mode=Mode.INT8,
                                          calib_synthetic=4, measure=False), Console(quiet=True))
    assert report.model is not None and default_opset(report.model) >= 13
    assert any("opset raised 9 -> 13" in n for n in report.data["notes"])
    ort.InferenceSession(report.model.SerializeToString(), providers=["CPUExecutionProvider"])
