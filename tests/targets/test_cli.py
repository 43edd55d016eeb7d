"""`edgectl targets|inspect|partition` end to end, through the real entry point."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from tests.targets import graphs

ROOT = Path(__file__).resolve().parents[2]


def edgectl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edgectl.cli.main", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


@pytest.fixture
def model_path(tmp_path: Path) -> Path:
    path = tmp_path / "model.onnx"
    onnx.save(graphs.unsupported_in_middle(), str(path))
    return path


def test_targets_list_and_show(tmp_path: Path) -> None:
    listed = json.loads(edgectl("targets", "list", "--json", cwd=tmp_path).stdout)
    assert {"nnapi", "myriad", "cpu-arm"} <= {p["name"] for p in listed}
    shown = edgectl("targets", "show", "myriad", cwd=tmp_path)
    assert shown.returncode == 0 and "2022.3" in shown.stdout
    missing = edgectl("targets", "show", "nope", cwd=tmp_path)
    assert missing.returncode == 2 and missing.stderr.startswith("error: unknown target 'nope'")


def test_inspect_json_html_and_all(model_path: Path, tmp_path: Path) -> None:
    result = edgectl("inspect", str(model_path), "--target", "nnapi", "--json", "--html", str(tmp_path / "r.html"),
                     cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["verdict"] == "MAYBE" and len(data["partitions"]) == 3
    page = (tmp_path / "r.html").read_text()
    assert "<svg" in page and "NnapiExecutionProvider" in page and "http" not in page.split("<svg")[0].lower()
    summary = edgectl("inspect", str(model_path), "--target", "all", "--json", cwd=tmp_path)
    assert {a["target"] for a in json.loads(summary.stdout)} >= {"nnapi", "jetson-orin", "cpu-x86"}
    table = edgectl("inspect", str(model_path), "--target", "nnapi", cwd=tmp_path)
    assert "nnapi: MAYBE" in table.stdout and "Erf" in table.stdout


def test_partition_writes_pieces(model_path: Path, tmp_path: Path) -> None:
    result = edgectl("partition", str(model_path), "--target", "nnapi", "-o", str(tmp_path / "out"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert len(json.loads((tmp_path / "out" / "partitions.json").read_text())["pieces"]) == 3


def _opset_too_new(path: Path) -> None:
    model = graphs.elementwise(17)
    model.opset_import[0].version = 99
    path.write_bytes(model.SerializeToString())


def _external_outside(path: Path) -> None:
    model = graphs.conv_chain()
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="w.bin",
              size_threshold=0)
    model = onnx.load(str(path), load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = "../w.bin"
    path.write_bytes(model.SerializeToString())


BAD = {
    "not-onnx": lambda p: p.write_text("this is not a model\n" * 10),
    "truncated": lambda p: p.write_bytes(graphs.conv_chain().SerializeToString()[:200]),
    "opset-too-new": _opset_too_new,
    "external-outside": _external_outside,
}


@pytest.mark.parametrize("kind", list(BAD))
def test_bad_input_is_one_line_exit_2_and_nothing_written(kind: str, tmp_path: Path) -> None:
    path = tmp_path / "bad" / "model.onnx"
    path.parent.mkdir()
    BAD[kind](path)
    for args in (["inspect", str(path), "-t", "nnapi", "--html", str(tmp_path / "r.html")],
                 ["partition", str(path), "-t", "nnapi", "-o", str(tmp_path / "out")]):
        result = edgectl(*args, cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
        assert not (tmp_path / "r.html").exists() and not (tmp_path / "out").exists()
