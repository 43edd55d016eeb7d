"""The accuracy loop keeps the sensitive layer float and really reduces the error; target fallbacks get fixed."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from quantize import Mode, QuantizeRequest, run_quantize
from quantize.pipeline import attempt_quantize
from quantize.rules import is_quantized


def test_keeping_sensitive_nodes_float_reduces_error(mlp_path: Path, tmp_path: Path) -> None:
    # The MLP's output [1,10] has no class-score evidence: it is judged by SQNR against a mid-range --min-db.
    request = QuantizeRequest(model=mlp_path, target="cpu-x86", output=tmp_path / "o.onnx", mode=Mode.INT8,
                              calib_synthetic=20, min_db=20.0, measure=False, per_node_errors=True)
    report = run_quantize(request, Console(quiet=True))
    int8 = report.data["variants"][-1]
    loop = int8["accuracy_loop"]
    assert loop[0]["unit"] == "dB" and loop[0]["value"] < 20.0  # the outlier unit ruins plain INT8
    assert loop[0]["budget_share"] > 1.0 >= int8["accuracy"]["budget_share"]
    assert int8["accuracy"]["value"] >= 20.0 and int8["accuracy"]["ok"]
    assert "mm1" in int8["kept_float"] or "mm2" in int8["kept_float"]  # the layer around the outlier
    assert report.model is not None and is_quantized(report.model)  # the rest is still INT8
    worst = min(report.errors, key=lambda e: e["qdq_sqnr_db"])
    assert worst["tensor"] in ("h", "r0")
    assert "<svg" in report.html()


def test_quantization_that_adds_fallbacks_is_fixed_by_keeping_nodes_float(cnn_path: Path, tmp_path: Path) -> None:
    # Myriad runs FP16 only: its op table has no QuantizeLinear, so every QDQ pair would fall back to CPU.
    request = QuantizeRequest(model=cnn_path, target="myriad", output=tmp_path / "o.onnx", mode=Mode.INT8,
                              calib_synthetic=8, measure=False)
    outcome = attempt_quantize(request)
    int8 = outcome.report.data["variants"][-1]
    check = int8["target_check"]
    assert check["ok"] and check["kept_float_for_target"]
    assert check["after"]["accelerator_partitions"] <= check["before"]["accelerator_partitions"]
    # Every node had to stay float: that is the float model, never written as "int8".
    assert outcome.failure is not None and "it is the float model, not int8" in str(outcome.failure)
    assert any("MYRIAD needs the OpenVINO runtime" in n and "2022.3" in n for n in outcome.report.data["notes"])
