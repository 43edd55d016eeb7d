"""Rollout gates, in process: parsing with its one-line refusals, each metric over a wave's facts, each
comparison at its boundary, and "no data" never failing a wave."""

from __future__ import annotations

import math

import pytest

from edgecore.errors import UserError
from edgectl.controller.gates import (
    DeviceFacts,
    Gate,
    Verdict,
    blocking,
    first_failing,
    parse_duration,
    parse_gate,
    parse_gates,
    parse_rate,
)
from edgectl.controller.records import DeviceStatus

D = DeviceStatus

PARSED = [  # text, metric, op, threshold in base units, unit
    ("failure_rate <= 5%", "failure_rate", "<=", 0.05, "%"),
    ("failure_rate<0.2", "failure_rate", "<", 0.2, ""),
    ("  error_rate == 1%  ", "error_rate", "==", 0.01, "%"),
    ("silence <= 90s", "silence", "<=", 90.0, "s"),
    ("silence <= 2m", "silence", "<=", 120.0, "m"),
    ("silence < 1h", "silence", "<", 3600.0, "h"),
    ("p95_latency <= 1.2x", "p95_latency", "<=", 1.2, "x"),
    ("p95_latency <= 20ms", "p95_latency", "<=", 20.0, "ms"),
    ("ep_fallback <= 0%", "ep_fallback", "<=", 0.0, "%"),
    ("agreement >= 0.99", "agreement", ">=", 0.99, ""),
    ("agreement > 99%", "agreement", ">", 0.99, "%"),
    ("failure_rate <= 100%", "failure_rate", "<=", 1.0, "%"),  # the highest rate there is
]


@pytest.mark.parametrize(("text", "metric", "op", "threshold", "unit"), PARSED, ids=[p[0].strip() for p in PARSED])
def test_a_gate_parses_to_base_units(text: str, metric: str, op: str, threshold: float, unit: str) -> None:
    gate = parse_gate(text)
    assert (gate.text, gate.metric, gate.op, gate.unit) == (text.strip(), metric, op, unit)
    assert gate.threshold == pytest.approx(threshold)


REFUSED = [
    ("failure_rate", "expected METRIC OP NUMBER[UNIT]"),
    ("failure_rate => 5%", "expected METRIC OP NUMBER[UNIT]"),
    ("failure_rate <= -5%", "expected METRIC OP NUMBER[UNIT]"),
    ("latency <= 2x", "unknown metric 'latency'"),
    ("silence <= 5%", "unit '%' does not fit silence"),
    ("failure_rate <= 5s", "unit 's' does not fit failure_rate"),
    ("p95_latency <= 2", "unit 'none' does not fit p95_latency (use 'x', 'ms')"),
    ("failure_rate <= 101%", "a rate must lie between 0 and 1"),
    ("error_rate <= 1.5", "a rate must lie between 0 and 1"),
    ("ep_fallback <= 1.01", "a rate must lie between 0 and 1"),
    ("agreement >= 100.5%", "a rate must lie between 0 and 1"),
]


@pytest.mark.parametrize(("text", "message"), REFUSED, ids=[r[0] for r in REFUSED])
def test_a_bad_gate_is_refused_with_one_line_naming_it(text: str, message: str) -> None:
    with pytest.raises(UserError) as caught:
        parse_gate(text)
    assert message in str(caught.value) and repr(text) in str(caught.value) and "\n" not in str(caught.value)


def test_gates_that_are_not_rates_may_exceed_one() -> None:
    assert parse_gate("p95_latency <= 2.5x").threshold == 2.5 and parse_gate("silence <= 3s").threshold == 3.0
    assert [g.metric for g in parse_gates(["silence <= 1s", "agreement >= 0.5"])] == ["silence", "agreement"]


@pytest.mark.parametrize(("text", "value"), [("5%", 0.05), ("0.05", 0.05), ("0", 0.0), ("100%", 1.0), ("1", 1.0), ("0%", 0.0)])
def test_a_rate_reads_as_a_fraction(text: str, value: float) -> None:
    assert parse_rate(text, "--max-failure") == pytest.approx(value)


@pytest.mark.parametrize(("text", "message"), [("five", "is not a rate"), ("%", "is not a rate"), ("101%", "between 0% and 100%"),
                                               ("1.01", "between 0% and 100%"), ("-1%", "between 0% and 100%")])
def test_a_bad_rate_is_refused(text: str, message: str) -> None:
    with pytest.raises(UserError, match=f"--max-failure: {text!r}.*{message}"):
        parse_rate(text, "--max-failure")


@pytest.mark.parametrize(("text", "seconds"), [("90", 90.0), ("90s", 90.0), ("10m", 600.0), ("1h", 3600.0), (" 1.5m ", 90.0)])
def test_a_duration_reads_in_seconds(text: str, seconds: float) -> None:
    assert parse_duration(text, "--bake") == seconds


@pytest.mark.parametrize("text", ["", "ten", "5d", "-5s", "1h30m"])
def test_a_bad_duration_is_refused(text: str) -> None:
    with pytest.raises(UserError, match=r"--bake: .* is not a duration"):
        parse_duration(text, "--bake")


# -- each metric over a wave -----------------------------------------------------------------------------


def ok(device: str = "d", **facts: float | bool | int | None) -> DeviceFacts:
    return DeviceFacts(device, D.OK, **facts)  # type: ignore[arg-type]


def value(text: str, facts: list[DeviceFacts]) -> float | None:
    return parse_gate(text).check(facts).value


def test_failure_rate_counts_failed_and_rolled_back_among_devices_sent_the_update() -> None:
    facts = [DeviceFacts("a", D.FAILED), DeviceFacts("b", D.ROLLED_BACK), DeviceFacts("c", D.OK), DeviceFacts("d", D.RUNNING),
             DeviceFacts("e", D.SENT), DeviceFacts("f", D.ROLLBACK_SENT), DeviceFacts("g", D.SUPERSEDED)]
    unsent = [DeviceFacts(s.value, s) for s in (D.DEFERRED, D.SKIPPED, D.PLANNED, D.CANCELLED)]
    assert value("failure_rate <= 5%", facts + unsent) == pytest.approx(2 / 7)
    assert value("failure_rate <= 5%", unsent) is None  # nobody was sent it yet: no data


def test_silence_is_the_longest_silence_of_an_installed_device() -> None:
    facts = [ok("a", silent_s=5.0), ok("b", silent_s=50.0), ok("c"), DeviceFacts("d", D.FAILED, silent_s=500.0)]
    assert value("silence <= 60s", facts) == 50.0
    assert value("silence <= 60s", [ok("c"), DeviceFacts("d", D.RUNNING, silent_s=9.0)]) is None


def test_p95_latency_is_the_median_ratio_or_the_worst_milliseconds_of_installed_devices() -> None:
    facts = [ok("a", latency_ratio=1.0, p95_ms=4.0), ok("b", latency_ratio=3.0, p95_ms=9.0), ok("c", latency_ratio=1.5),
             DeviceFacts("d", D.FAILED, latency_ratio=10.0, p95_ms=100.0)]
    assert value("p95_latency <= 2x", facts) == 1.5
    assert value("p95_latency <= 20ms", facts) == 9.0
    assert value("p95_latency <= 2x", [ok("x"), DeviceFacts("y", D.RUNNING, latency_ratio=1.0)]) is None
    assert value("p95_latency <= 20ms", [ok("x", latency_ratio=1.0)]) is None


def test_error_rate_is_errors_over_requests_of_installed_devices() -> None:
    facts = [ok("a", requests=90, errors=1), ok("b", requests=10, errors=3), DeviceFacts("c", D.FAILED, requests=100, errors=100),
             ok("d", requests=100)]
    assert value("error_rate <= 1%", facts) == pytest.approx(0.02)
    assert value("error_rate <= 1%", [ok("a"), ok("b")]) is None  # no request: no data, not 0%


def test_ep_fallback_is_the_share_of_installed_devices_known_to_have_fallen_back() -> None:
    facts = [ok("a", fallback=True), ok("b", fallback=False), ok("c", fallback=False), ok("d"),
             DeviceFacts("e", D.FAILED, fallback=True)]
    assert value("ep_fallback <= 0%", facts) == pytest.approx(1 / 3)
    assert value("ep_fallback <= 0%", [ok("d")]) is None


def test_agreement_is_the_lowest_reported_by_any_device_installed_or_not() -> None:
    facts = [ok("a", agreement=0.995), DeviceFacts("b", D.RUNNING, agreement=0.97), ok("c")]
    assert value("agreement >= 0.99", facts) == 0.97
    assert value("agreement >= 0.99", [ok("c")]) is None


# -- holding: each comparison at its boundary, no data, and the first failing gate --------------------------

BOUNDARIES = [  # gate, the measured value, holds
    ("failure_rate <= 25%", 0.25, True), ("failure_rate <= 25%", 0.26, False),
    ("failure_rate < 25%", 0.25, False), ("failure_rate < 25%", 0.24, True),
    ("agreement >= 0.9", 0.9, True), ("agreement >= 0.9", 0.89, False),
    ("agreement > 0.9", 0.9, False), ("agreement > 0.9", 0.91, True),
    ("failure_rate == 0%", 0.0, True), ("failure_rate == 0%", 0.01, False),
]


@pytest.mark.parametrize(("text", "measured", "holds"), BOUNDARIES, ids=[f"{t} at {m}" for t, m, _ in BOUNDARIES])
def test_each_comparison_at_its_boundary(text: str, measured: float, holds: bool) -> None:
    facts = [ok("a", agreement=measured)] if text.startswith("agreement") else _failures(measured)
    result = parse_gate(text).check(facts)
    assert result.value == pytest.approx(measured) and result.holds is holds and result.gate == text


def _failures(rate: float) -> list[DeviceFacts]:
    failed = round(rate * 100)
    return [DeviceFacts(f"f{i}", D.FAILED) for i in range(failed)] + [ok(f"o{i}") for i in range(100 - failed)]


def test_a_gate_with_no_data_neither_holds_nor_fails_and_says_so() -> None:
    result = parse_gate("p95_latency <= 1.2x").check([])
    assert (result.value, result.verdict, result.holds, result.fails) == (None, Verdict.NO_DATA, False, False)
    assert result.detail.startswith("no data (")


def test_no_data_blocks_promotion_unless_the_rollout_allows_it() -> None:
    results = [g.check([ok("a", silent_s=1.0)]) for g in parse_gates(["silence <= 60s", "error_rate <= 1%"])]
    assert [r.verdict for r in results] == [Verdict.HOLDS, Verdict.NO_DATA]  # no request served: no error rate
    assert blocking(results, allow_no_data=False) == [results[1]]
    assert blocking(results, allow_no_data=True) == []
    failing = parse_gate("silence <= 1s").check([ok("a", silent_s=5.0)])
    assert blocking([failing], allow_no_data=True) == [failing]  # allowing no data never lets a failure through


def test_a_device_whose_baseline_is_unknown_holds_the_ratio_gate() -> None:
    gate = parse_gate("p95_latency <= 1.2x")
    known = [ok("a", latency_ratio=1.0), ok("b", latency_ratio=1.1)]
    assert gate.check(known).holds
    result = gate.check([*known, ok("c", latency_baseline_missing=True)])
    assert result.verdict is Verdict.NO_DATA  # not the median of the two that are known
    assert gate.check([ok("c", latency_baseline_missing=True)]).verdict is Verdict.NO_DATA
    assert parse_gate("p95_latency <= 5ms").check([ok("c", p95_ms=3.0, latency_baseline_missing=True)]).holds


DETAILS = [
    ("failure_rate <= 5%", [DeviceFacts("a", D.FAILED), ok("b"), ok("c"), ok("d")], "failure_rate = 25.0%"),
    ("failure_rate <= 0.05", [DeviceFacts("a", D.FAILED), ok("b")], "failure_rate = 50.0%"),
    ("agreement >= 99%", [ok("a", agreement=0.5)], "agreement = 50.0%"),
    ("agreement >= 0.99", [ok("a", agreement=0.5)], "agreement = 0.5000"),
    ("p95_latency <= 2x", [ok("a", latency_ratio=2.5)], "p95_latency = 2.50x"),
    ("p95_latency <= 5ms", [ok("a", p95_ms=7.25)], "p95_latency = 7.25 ms"),
    ("silence <= 1m", [ok("a", silent_s=61.4)], "silence = 61s"),
    ("p95_latency <= 2x", [ok("a", latency_ratio=math.inf)], "p95_latency = inf"),
]


@pytest.mark.parametrize(("text", "facts", "detail"), DETAILS, ids=[d[2] for d in DETAILS])
def test_a_result_shows_the_value_in_the_gates_unit(text: str, facts: list[DeviceFacts], detail: str) -> None:
    assert parse_gate(text).check(facts).detail == detail


def test_first_failing_is_the_first_gate_that_does_not_hold() -> None:
    gates = parse_gates(["silence <= 60s", "failure_rate <= 10%", "failure_rate <= 5%"])
    facts = [DeviceFacts("a", D.FAILED)] + [ok(f"o{i}", silent_s=1.0) for i in range(9)]
    first = first_failing(gates, facts)
    assert first is not None and first.gate == "failure_rate <= 5%" and not first.holds
    assert first_failing(gates[:2], facts) is None
    assert first_failing([], facts) is None
    assert first_failing([Gate("g", "silence", "<=", 0.0, "s")], [ok("a")]) is None  # no data does not fail: it waits
