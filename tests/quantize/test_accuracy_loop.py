"""The accuracy loop keeps the sensitive layer float and really reduces the error; target fallbacks get fixed."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from quantize import Mode, QuantizeRequest, run_quantize
from quantize.rules import is_quantized


def test_keeping_sensitive_nodes_float_reduces_error(mlp_path: Path, tmp_path: Path) -> None:
    request = QuantizeRequest(model=mlp_path, target="cpu-x86", output=tmp_path / "o.onnx", mode=Mode.INT8,
                              calib_synthetic=20, max_drop=10.0, measure=False, per_node_errors=True)
    report = run_quantize(request, Console(quiet=True))
    int8 = report.data["variants"][-1]
    loop = int8["accuracy_loop"]
    assert loop[0]["drop"] > 10.0  # the outlier unit ruins plain INT8
    assert int8["accuracy"]["drop"] <= 10.0 < loop[0]["drop"]
    assert "mm1" in int8["kept_float"] or "mm2" in int8["kept_float"]  # the layer around the outlier
    assert report.model is not None and is_quantized(report.model)  # the rest is still INT8
    worst = min(report.errors, key=lambda e: e["qdq_sqnr_db"])
    assert worst["tensor"] in ("h", "r0")
    assert "<svg" in report.html()


def test_quantization_that_adds_fallbacks_is_fixed_by_keeping_nodes_float(cnn_path: Path, tmp_path: Path) -> None:
    # Myriad runs FP16 only: its op table has no QuantizeLinear, so every QDQ pair would fall back to CPU.
    request = QuantizeRequest(model=cnn_path, target="myriad", output=tmp_path / "o.onnx", mode=Mode.INT8,
                              calib_synthetic=8, measure=False)
    report = run_quantize(request, Console(quiet=True))
    check = report.data["variants"][-1]["target_check"]
    assert check["ok"] and check["kept_float_for_target"]
    assert check["after"]["accelerator_partitions"] <= check["before"]["accelerator_partitions"]
