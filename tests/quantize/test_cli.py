"""`edgectl quantize` end to end through the real CLI: files written, table and JSON report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_cli_writes_model_json_and_html(cnn_path: Path, cnn_calib: Path, tmp_path: Path) -> None:
    out, html = tmp_path / "o" / "cnn.int8.onnx", tmp_path / "r.html"
    proc = subprocess.run(
        [sys.executable, "-m", "edgectl.cli.main", "quantize", str(cnn_path), "--target", "nnapi", "-o", str(out),
         "--calib", str(cnn_calib), "--report", str(html)],
        capture_output=True, text=True, timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    assert "nnapi" in proc.stdout and "ORT ms" in proc.stdout
    report = json.loads(out.with_suffix(".quant.json").read_text())
    assert report["chosen"] == "int8" and report["variants"][-1]["target_check"]["ok"]
    assert out.is_file() and "<svg" in html.read_text()


def test_cli_refuses_unknown_mode(cnn_path: Path, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "edgectl.cli.main", "quantize", str(cnn_path), "--target",
                           "cpu-x86", "-o", str(tmp_path / "o.onnx"), "--mode", "int4"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--mode 'int4'" in proc.stderr


def test_cli_writes_an_openvino_ir_for_myriad(cnn_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "cnn.myriad.onnx"
    proc = subprocess.run([sys.executable, "-m", "edgectl.cli.main", "quantize", str(cnn_path), "--target", "myriad",
                           "-o", str(out), "--no-measure"], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.with_suffix(".quant.json").read_text())
    assert report["chosen"] == "fp16" and report["output"] == str(out.with_suffix(".xml"))
    assert "OpenVINO IR, FP16-compressed weights; 100% of weights float16" in report["chosen_format"]
    assert out.with_suffix(".xml").is_file() and out.with_suffix(".bin").is_file() and not out.exists()
    said = " ".join(proc.stderr.split())
    assert "MYRIAD needs the OpenVINO runtime" in said and "2022.3" in said
    wrote = f"wrote {out.with_suffix('.bin')} and {out.with_suffix('.xml')}"
    assert "".join(wrote.split()) in "".join(proc.stderr.split())  # rich folds long lines at the terminal width


def test_an_openvino_ir_is_refused_by_build_naming_the_onnx_way(tmp_path: Path) -> None:
    import pytest
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from edgecore.errors import UserError
    from edgectl.package import BuildOptions, build_package

    (tmp_path / "m.xml").write_text("<net/>")
    with pytest.raises(UserError, match=r"OpenVINO IR cannot be packaged yet .* package the ONNX model instead"):
        build_package(tmp_path / "m.xml", BuildOptions("m", 1), Ed25519PrivateKey.generate(), tmp_path / "m.edgepkg")
    assert not (tmp_path / "m.edgepkg").exists()
