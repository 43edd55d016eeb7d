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

A gate with no data yet (no baseline latency, no shadow report) neither holds nor fails: it is
reported as ``no data`` and does not block promotion.
"""

from __future__ import annotations

import math
import operator
import re
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agent.errors import UserError
from edgectl.controller.records import COUNTED_FAILED, DeviceStatus

__all__ = ["METRICS", "DeviceFacts", "Gate", "GateResult", "parse_duration", "parse_gate", "parse_gates", "parse_rate"]

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
    p95_ms: float | None = None
    silent_s: float | None = None  # since it was last heard from (any message) after install
    fallback: bool | None = None
    requests: int = 0
    errors: int = 0
    agreement: float | None = None


@dataclass(frozen=True)
class GateResult:
    gate: str
    value: float | None
    holds: bool
    detail: str


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
            return GateResult(self.text, None, True, "no data")
        holds = _OPS[self.op](value, self.threshold)
        return GateResult(self.text, value, holds, f"{self.metric} = {self._show(value)}")

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
    return float(match.group(1)) * _SECONDS.get(match.group(2) or "s", 1.0)


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
    if g.unit == "ms":
        values = [f.p95_ms for f in _installed(facts) if f.p95_ms is not None]
        return max(values) if values else None
    ratios = [f.latency_ratio for f in _installed(facts) if f.latency_ratio is not None]
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


_MEASURES: dict[str, Callable[[Gate, Sequence[DeviceFacts]], float | None]] = {
    "failure_rate": _failure_rate, "silence": _silence, "p95_latency": _latency,
    "error_rate": _error_rate, "ep_fallback": _fallback, "agreement": _agreement,
}
