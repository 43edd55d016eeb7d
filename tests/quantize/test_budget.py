"""The accuracy budget, judged in the unit of each output's metric, at mid-range values (never only 0 or 100)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from quantize import Mode, QuantizeRequest
from quantize.budget import Accuracy, Budget, OutputScore
from quantize.pipeline import attempt_quantize
from tests.corpus import CORPUS, write_corpus


def _points(value: float, output: str = "logits") -> OutputScore:
    return OutputScore(output, "top1", "top-1 agreement", "points", value, 100.0)


def _db(value: float, output: str = "boxes") -> OutputScore:
    return OutputScore(output, "sqnr", "SQNR", "dB", value, 100.0)


@pytest.mark.parametrize("score,budget,admitted", [
    (_points(97.5), Budget(max_drop=2.0), False),  # 2.5 points lost > 2
    (_points(97.5), Budget(max_drop=3.0), True),
    (_points(97.0), Budget(max_drop=2.0, min_db=0.0), False),  # 97 "dB" would pass any dB floor
    (_db(27.0), Budget(min_db=25.0), True),
    (_db(27.0), Budget(min_db=30.0), False),
    (_db(35.0), Budget(max_drop=1.0, min_db=30.0), True),  # 35 "points dropped" would fail a 1-point budget
    (_db(35.0), Budget(max_drop=50.0, min_db=40.0), False),
], ids=["points-over", "points-within", "points-not-read-as-dB", "dB-within", "dB-under", "dB-not-read-as-points",
        "dB-not-read-as-points-2"])
def test_each_output_is_judged_in_its_own_unit(score: OutputScore, budget: Budget, admitted: bool) -> None:
    assert budget.admits(Accuracy((score,), budget)) is admitted


def test_the_worst_output_is_the_one_using_the_most_of_its_budget() -> None:
    budget = Budget(max_drop=2.0, min_db=30.0)
    accuracy = Accuracy((_points(98.5), _db(26.0)), budget)  # 0.75 of the points budget; 26 dB is under 30
    assert accuracy.worst.output == "boxes" and not accuracy.ok
    assert budget.share(_points(98.5)) == pytest.approx(0.75)
    assert budget.share(_db(26.0)) == pytest.approx(10 ** (4 / 20))  # the RMS error over the one 30 dB allows
    assert "boxes: SQNR 26.0 dB < --min-db 30" in accuracy.summary()


def _request(tmp: Path, name: str, target: str, **budget: Any) -> QuantizeRequest:
    path = write_corpus(tmp, [name])[name]
    calib = tmp / "calib"
    calib.mkdir(exist_ok=True)
    for seed in range(6):
        arrays: dict[str, Any] = CORPUS[name].feeds(seed)  # Any: numpy's stub reads ** as its allow_pickle keyword
        np.savez(calib / f"{seed}.npz", **arrays)
    return QuantizeRequest(model=path, target=target, output=tmp / "out.onnx", mode=Mode.INT8, calib_dir=calib,
                           measure=False, **budget)


def test_a_mid_range_db_budget_decides_the_exit_code(tmp_path: Path) -> None:
    request = _request(tmp_path, "regression_head", "jetson-orin", min_db=-100.0)
    figure = attempt_quantize(request).report.data["variants"][-1]["accuracy"]["value"]
    assert 10.0 < figure < 90.0, figure  # INT8: neither exact nor useless
    assert attempt_quantize(replace(request, min_db=figure - 2.0)).written
    tight = attempt_quantize(replace(request, min_db=figure + 2.0))
    int8 = tight.report.data["variants"][-1]
    assert int8["accuracy_loop"][0]["budget_share"] > 1.0  # plain INT8 is over this budget
    # the accuracy loop may win the 2 dB back by keeping nodes float; written exactly when it did
    assert tight.written == (int8["accuracy"]["value"] >= figure + 2.0)
    if not tight.written:
        assert f"< --min-db {figure + 2.0:g}" in str(tight.failure)


def test_a_mid_range_points_budget_decides_the_exit_code(tmp_path: Path) -> None:
    request = _request(tmp_path, "detector_background", "cpu-x86", max_drop=100.0)
    int8 = attempt_quantize(request).report.data["variants"][-1]["accuracy"]
    assert int8["metric"] == "confident-detection agreement" and 1.0 < int8["drop"] < 99.0, int8
    assert attempt_quantize(replace(request, max_drop=int8["drop"] + 0.5)).written
    tight = attempt_quantize(replace(request, max_drop=int8["drop"] - 0.5))
    variant = tight.report.data["variants"][-1]
    assert variant["accuracy_loop"][0]["budget_share"] > 1.0
    assert tight.written == (variant["accuracy"]["drop"] <= int8["drop"] - 0.5)
    if not tight.written:
        assert "> --max-drop" in str(tight.failure)
