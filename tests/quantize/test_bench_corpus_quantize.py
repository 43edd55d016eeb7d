"""The quantize rows of ./scripts/bench corpus (scripts/corpus_quantize.py): written, exit 5 and refused, as they are."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.corpus import CORPUS, write_corpus

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from corpus_quantize import QuantSettings, describe, markdown, quantize_model


def test_rows_say_written_exit_5_and_refused_with_each_output(tmp_path: Path) -> None:
    path = write_corpus(tmp_path, ["detector"])["detector"]
    entry = CORPUS["detector"]
    written = quantize_model("detector", path, entry.feeds, tuple(entry.static_shape_args()), tmp_path,
                             QuantSettings(("nnapi", "edgetpu"), calib=2, measure_max_ms=0.0))
    # A budget of 90 dB cannot hold for INT8 under SQNR: the row keeps the figures the CLI would not write.
    failed = quantize_model("detector", path, entry.feeds, (), tmp_path,
                            QuantSettings(("jetson-orin",), calib=2, measure=False, min_db=90.0))
    (nnapi, edgetpu), (orin,) = written, failed
    assert nnapi.outcome == "written" and nnapi.data["chosen"] == "int8"
    row = describe(nnapi)
    assert "QDQ u8 act / s8 per-channel weights" in row[3]
    assert "boxes: SQNR" in row[4] and "scores: SQNR" in row[4] and " dB ok" in row[4]
    assert row[5].startswith("agrees: ")  # the written file's figures, recomputed on the same samples
    assert nnapi.checks and all(c.agrees for c in nnapi.checks) and {c.output for c in nnapi.checks} == {"boxes", "scores"}
    assert row[6].startswith("not measured (float ") and row[6].endswith("> --measure-max-ms 0)")
    assert "latency not measured (--no-measure)" in nnapi.data["notes"]  # the cap reached the pipeline
    assert edgetpu.outcome == "refused" and "edgetpu" in edgetpu.reason and describe(edgetpu)[3] == "-"
    assert orin.outcome == "exit 5" and "accuracy budget not met" in orin.reason
    assert "OVER" in describe(orin)[4] and orin.data["chosen"] == "int8" and not orin.checks
    assert not list(tmp_path.glob("detector.*.onnx"))  # nothing written by a benchmark
    (skipped,) = quantize_model("detector", path, entry.feeds, (), tmp_path, QuantSettings(("nnapi",), quantize_max_ms=0.0))
    assert skipped.outcome == "skipped" and skipped.reason.endswith("> --quantize-max-ms 0") and not skipped.data
    text = markdown([nnapi, edgetpu, orin], QuantSettings(("nnapi", "edgetpu"), measure=False))
    assert "**1 written, 1 exit 5, 1 refused, 0 skipped, 0 other** of 3" in text and "latency not measured" in text
    assert "**1 of 1 agree**" in text
