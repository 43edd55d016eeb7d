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
