"""Rollout gates: ``METRIC OP NUMBER[UNIT]`` expressions checked against a wave's devices.

=============  ==================================================  =====================
metric         measured over the wave's devices that installed     units
=============  ==================================================  =====================
failure_rate   failed / devices that were sent the update           ``%`` or a fraction
silence        longest time a device stayed silent after install    ``s``, ``m``, ``h``
p95_latency    median of new p95 / the device's previous-model p95  ``x``; or ``ms`` (max)
error_rate     inference errors / requests on the new model         ``%`` or a fraction
ep_fallback    share of devices on a backend their profile ranks    ``%`` or a fraction
               below its first execution provider
agreement      lowest shadow-run agreement with the old model       ``%`` or a fraction
=============  ==================================================  =====================

Each gate gives one of three verdicts (:class:`Verdict`): it holds, it fails, or it has **no data**
(no device installed, no request served, no latency baseline known, no shadow report); a fourth,
**not judged**, is for a gate that does not apply to a wave (``agreement`` on a wave whose devices run
no shadow: only the first wave of a ``--shadow`` rollout does), which neither holds nor blocks. No data is
never a pass: a wave whose gate has no data when its bake ends waits for data until a deadline and
then halts, unless the rollout was created with ``--allow-no-data`` (``RolloutSpec.allow_no_data``),
which the engine alone reads (:func:`blocking`). A latency ratio needs a baseline: the device's own
p95 on its previous model, else what is known of that previous model on the fleet's devices of the
same target (``DeviceFacts.latency_ratio``); a device with neither leaves the gate without data.

The gates are the one place a wave's verdict is made: the failure budget (``--max-failure``
becomes a ``failure_rate`` gate) halts an installing wave through :func:`first_failing` as it
does a baking one, so there is no second copy of the rule to disagree with the first.
"""

from __future__ import annotations

import enum
import math
import operator
import re
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from edgecore.errors import UserError
from edgectl.controller.records import COUNTED_FAILED, DeviceStatus

__all__ = [
    "METRICS", "DeviceFacts", "Gate", "GateResult", "Verdict", "blocking", "first_failing", "parse_duration", "parse_gate",
    "parse_gates", "parse_rate",
]

_OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt, "==": operator.eq,
}
METRICS: dict[str, tuple[str, ...]] = {
    "failure_rate": ("%", ""),
    "silence": ("s", "m", "h"),
    "p95_latency": ("x", "ms"),
    "error_rate": ("%", ""),
    "ep_fallback": ("%", ""),
    "agreement": ("%", ""),
}
_EXPR = re.compile(r"^\s*([a-z_0-9]+)\s*(<=|>=|==|<|>)\s*([0-9]+(?:\.[0-9]+)?)\s*([a-z%]*)\s*$")
_SECONDS = {"s": 1.0, "m": 60.0, "h": 3600.0}
# Devices that never got the update (or are offline with it waiting) do not count in failure_rate.
_NOT_SENT = (DeviceStatus.DEFERRED, DeviceStatus.SKIPPED, DeviceStatus.PLANNED, DeviceStatus.CANCELLED)


@dataclass
class DeviceFacts:
    """What the controller knows about one wave device when it checks the gates."""

    device_id: str
    status: DeviceStatus
    latency_ratio: float | None = None
    latency_baseline_missing: bool = False  # it ran a previous model whose p95 nobody knows: no ratio can be made
    p95_ms: float | None = None
    silent_s: float | None = None  # since it was last heard from (any message) after install
    fallback: bool | None = None
    requests: int = 0
    errors: int = 0
    agreement: float | None = None


class Verdict(str, enum.Enum):
    HOLDS = "holds"
    FAILS = "fails"
    NO_DATA = "no data"
    NOT_JUDGED = "not judged"  # the gate does not apply to this wave (agreement where no device runs a shadow)


@dataclass(frozen=True)
class GateResult:
    gate: str
    value: float | None
    verdict: Verdict
    detail: str

    @property
    def holds(self) -> bool:
        return self.verdict is Verdict.HOLDS

    @property
    def fails(self) -> bool:
        return self.verdict is Verdict.FAILS


@dataclass(frozen=True)
class Gate:
    text: str
    metric: str
    op: str
    threshold: float  # in base units: fraction, seconds, ratio or ms
    unit: str

    def check(self, facts: Sequence[DeviceFacts]) -> GateResult:
        value = _MEASURES[self.metric](self, facts)
        if value is None:
            return GateResult(self.text, None, Verdict.NO_DATA, f"no data ({_NO_DATA[self.metric]})")
        verdict = Verdict.HOLDS if _OPS[self.op](value, self.threshold) else Verdict.FAILS
        return GateResult(self.text, value, verdict, f"{self.metric} = {self._show(value)}")

    def not_judged(self, why: str) -> GateResult:
        """This gate's result on a wave it does not apply to, saying ``why``."""
        return GateResult(self.text, None, Verdict.NOT_JUDGED, f"not judged: {why}")

    def _show(self, value: float) -> str:
        if math.isinf(value):
            return "inf"
        if self.unit == "%" or (self.unit == "" and self.metric != "agreement"):
            return f"{value * 100:.1f}%"
        if self.unit == "x":
            return f"{value:.2f}x"
        if self.unit == "ms":
            return f"{value:.2f} ms"
        if self.unit in _SECONDS:
            return f"{value:.0f}s"
        return f"{value:.4f}"


def parse_gate(text: str) -> Gate:
    """Parse one gate expression; raise UserError naming what is wrong."""
    match = _EXPR.match(text)
    if not match:
        raise UserError(f"gate {text!r}: expected METRIC OP NUMBER[UNIT], e.g. 'p95_latency <= 1.2x' or 'failure_rate <= 5%'")
    metric, op, number, unit = match.groups()
    if metric not in METRICS:
        raise UserError(f"gate {text!r}: unknown metric {metric!r} (known: {', '.join(METRICS)})")
    if unit not in METRICS[metric]:
        units = ", ".join(repr(u) if u else "none" for u in METRICS[metric])
        raise UserError(f"gate {text!r}: unit {unit or 'none'!r} does not fit {metric} (use {units})")
    value = float(number)
    if unit == "%":
        value /= 100.0
    elif unit in _SECONDS:
        value *= _SECONDS[unit]
    if metric in ("failure_rate", "error_rate", "ep_fallback", "agreement") and value > 1.0:
        raise UserError(f"gate {text!r}: a rate must lie between 0 and 1 (or 0% and 100%)")
    return Gate(text.strip(), metric, op, value, unit)


def parse_gates(texts: Sequence[str]) -> list[Gate]:
    return [parse_gate(text) for text in texts]


def first_failing(gates: Iterable[Gate], facts: Sequence[DeviceFacts]) -> GateResult | None:
    """The first of ``gates`` that fails over ``facts``, or None (a gate with no data does not fail: it waits)."""
    return next((result for result in (gate.check(facts) for gate in gates) if result.fails), None)


def blocking(results: Iterable[GateResult], allow_no_data: bool) -> list[GateResult]:
    """What keeps a baked wave from promotion: the gates that fail, or have no data unless the rollout allows it."""
    return [r for r in results if r.fails or (r.verdict is Verdict.NO_DATA and not allow_no_data)]


def parse_rate(text: str, what: str) -> float:
    """``5%`` or ``0.05`` as a fraction."""
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise UserError(f"{what}: {text!r} is not a rate such as 5% or 0.05") from None
    if not 0 <= value <= 1:
        raise UserError(f"{what}: {text!r} must lie between 0% and 100%")
    return value


def parse_duration(text: str, what: str) -> float:
    """``90``, ``90s``, ``10m`` or ``1h`` in seconds."""
    match = re.match(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([smh]?)\s*$", text)
    if not match:
        raise UserError(f"{what}: {text!r} is not a duration such as 30s, 10m or 1h")
    return float(match.group(1)) * _SECONDS[match.group(2) or "s"]


def _installed(facts: Sequence[DeviceFacts]) -> list[DeviceFacts]:
    return [f for f in facts if f.status == DeviceStatus.OK]


def _failure_rate(_g: Gate, facts: Sequence[DeviceFacts]) -> float | None:
    counted = [f for f in facts if f.status not in _NOT_SENT]
    if not counted:
        return None
    return sum(f.status in COUNTED_FAILED for f in counted) / len(counted)


def _silence(_g: Gate, facts: Sequence[DeviceFacts]) -> float | None:
    values = [f.silent_s for f in _installed(facts) if f.silent_s is not None]
    return max(values) if values else None


def _latency(g: Gate, facts: Sequence[DeviceFacts]) -> float | None:
    installed = _installed(facts)
    if g.unit == "ms":
        values = [f.p95_ms for f in installed if f.p95_ms is not None]
        return max(values) if values else None
    if any(f.latency_baseline_missing for f in installed):
        return None  # a device whose old latency nobody knows is held, not left out of the median
    ratios = [f.latency_ratio for f in installed if f.latency_ratio is not None]
    return statistics.median(ratios) if ratios else None


def _error_rate(_g: Gate, facts: Sequence[DeviceFacts]) -> float | None:
    requests = sum(f.requests for f in _installed(facts))
    return sum(f.errors for f in _installed(facts)) / requests if requests else None


def _fallback(_g: Gate, facts: Sequence[DeviceFacts]) -> float | None:
    known = [f.fallback for f in _installed(facts) if f.fallback is not None]
    return sum(known) / len(known) if known else None


def _agreement(_g: Gate, facts: Sequence[DeviceFacts]) -> float | None:
    values = [f.agreement for f in facts if f.agreement is not None]
    return min(values) if values else None


_NO_DATA = {
    "failure_rate": "no device of the wave was sent the update yet",
    "silence": "no device of the wave has installed",
    "p95_latency": "no latency, or no baseline for a device's previous model",
    "error_rate": "no request served on the new model",
    "ep_fallback": "no device reported its backend",
    "agreement": "no shadow report",
}
_MEASURES: dict[str, Callable[[Gate, Sequence[DeviceFacts]], float | None]] = {
    "failure_rate": _failure_rate, "silence": _silence, "p95_latency": _latency,
    "error_rate": _error_rate, "ep_fallback": _fallback, "agreement": _agreement,
}
