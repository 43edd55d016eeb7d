"""attempt_quantize: the pipeline's result without raising for exit 5, for callers that tabulate (bench corpus)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rich.console import Console

from edgecore.errors import OperationFailed, UserError
from quantize.pipeline import QuantizeRequest, attempt_quantize, run_quantize
from quantize.recipe import Mode
from tests.corpus import CORPUS, write_corpus
from tests.quantize.models import save, tiny_cnn


def _request(tmp: Path, min_db: float, **kw: Any) -> QuantizeRequest:
    path = save(tiny_cnn(), tmp / "m.onnx")
    return QuantizeRequest(model=path, target="jetson-orin", output=tmp / "out.onnx", mode=Mode.INT8,
                           calib_synthetic=4, measure=False, min_db=min_db, metric=("sqnr",), **kw)


def test_budget_failure_returns_the_report_and_the_exit_5_reason(tmp_path: Path,
                                                                 capfd: pytest.CaptureFixture[str]) -> None:
    request = _request(tmp_path, min_db=90.0)  # int8 never comes within float noise of the float model
    outcome = attempt_quantize(request)
    assert not outcome.written and outcome.report.model is None
    assert outcome.failure is not None and "accuracy budget not met" in str(outcome.failure)
    assert "logits: SQNR" in str(outcome.failure) and "< --min-db 90" in str(outcome.failure)
    int8 = next(v for v in outcome.report.data["variants"] if v["name"] == "int8")
    assert int8["accuracy"]["value"] < 90.0 and int8["accuracy"]["outputs"][0]["output"] == "logits"
    assert not (tmp_path / "out.onnx").exists()
    assert capfd.readouterr().out == ""  # the synthetic-calibration warning went to the quiet console
    with pytest.raises(OperationFailed) as raised:
        run_quantize(request, Console(quiet=True))
    assert str(raised.value) == str(outcome.failure)


def test_success_carries_the_model_and_no_failure(tmp_path: Path) -> None:
    outcome = attempt_quantize(_request(tmp_path, min_db=0.0))
    assert outcome.written and outcome.failure is None
    assert outcome.report.model is not None and outcome.report.data["chosen"] == "int8"


def test_bad_input_still_raises(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="edgetpu"):
        attempt_quantize(QuantizeRequest(model=save(tiny_cnn(), tmp_path / "m.onnx"), target="edgetpu",
                                         output=tmp_path / "o.onnx", calib_synthetic=4, measure=False))


def test_fp16_only_plan_scores_on_the_calib_samples(tmp_path: Path) -> None:
    # Random samples give the Loop random counts (up to 255) and fp16 then disagrees; --calib holds the real ones.
    path = write_corpus(tmp_path, ["loop_convs"])["loop_convs"]
    calib = tmp_path / "calib"
    calib.mkdir()
    for seed in range(4):
        arrays: dict[str, Any] = CORPUS["loop_convs"].feeds(seed)  # Any: numpy's stub types ** as allow_pickle
        np.savez(calib / f"{seed}.npz", **arrays)
    outcome = attempt_quantize(QuantizeRequest(model=path, target="myriad", output=tmp_path / "o.onnx",
                                               calib_dir=calib, measure=False))
    assert outcome.report.data["eval"] == "calibration samples (4)"
    assert outcome.written and outcome.report.data["chosen"] == "fp16"
