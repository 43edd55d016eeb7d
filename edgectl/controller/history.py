"""A device's telemetry history: the figures the console's device page charts, one point per kept report.

Agents publish a telemetry report every few seconds (``agent/daemon.py``; light agents in
``edgectl/sim.py`` send the same shape): ``device`` (``cpu_percent``, ``memory_percent``, ...) and
``models`` (per published model: ``version``, ``requests``, ``latency_ms`` p50/p95/p99, ``throughput_rps``).
A point keeps the device's CPU and memory, the latency of the model that served the most requests in the
report's window, and the device's inference rate: the agents' ``throughput_rps`` summed over models, or
(a light agent sends counters only) the growth of the request counters between two points.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

__all__ = ["TelemetryPoint", "telemetry_point", "with_rates"]


@dataclass(frozen=True)
class TelemetryPoint:
    device_id: str
    ts: float  # the device's own time of the report
    model: str = ""  # the model the latency figures are of ("" when the device serves none)
    version: int | None = None
    p50_ms: float | None = None
    p95_ms: float | None = None
    cpu_percent: float | None = None
    memory_percent: float | None = None
    requests: int | None = None  # requests served, summed over models (a counter since the agent started)
    rate_rps: float | None = None  # inference requests per second

    def to_dict(self) -> dict[str, Any]:
        return {"ts": self.ts, "model": self.model, "version": self.version, "p50_ms": self.p50_ms, "p95_ms": self.p95_ms,
                "cpu_percent": self.cpu_percent, "memory_percent": self.memory_percent, "requests": self.requests,
                "rate_rps": self.rate_rps}


def _number(value: object) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _served(stats: Mapping[str, Any]) -> float:
    return _number(stats.get("window_requests")) or _number(stats.get("requests")) or 0.0


def telemetry_point(device_id: str, report: Mapping[str, Any], ts: float) -> TelemetryPoint:
    """The history point of one telemetry report; fields the report lacks (or holds no finite number for) are None."""
    device = report.get("device")
    device = device if isinstance(device, dict) else {}
    models = report.get("models")
    stats = {name: s for name, s in models.items() if isinstance(s, dict)} if isinstance(models, dict) else {}
    point = TelemetryPoint(device_id, ts, cpu_percent=_number(device.get("cpu_percent")),
                           memory_percent=_number(device.get("memory_percent")))
    if not stats:
        return point
    name = max(sorted(stats), key=lambda n: _served(stats[n]))
    main = stats[name]
    latency = main.get("latency_ms")
    latency = latency if isinstance(latency, dict) else {}
    version = str(main.get("version", ""))
    counts = [_number(s.get("requests")) for s in stats.values()]
    rates = [_number(s.get("throughput_rps")) for s in stats.values()]
    return replace(point, model=name, version=int(version) if version.isdigit() else None,
                   p50_ms=_number(latency.get("p50")), p95_ms=_number(latency.get("p95")),
                   requests=int(sum(c for c in counts if c is not None)) if any(c is not None for c in counts) else None,
                   rate_rps=sum(r for r in rates if r is not None) if any(r is not None for r in rates) else None)


def with_rates(points: Iterable[TelemetryPoint]) -> list[TelemetryPoint]:
    """The points (oldest first), each without a rate given one from the request counters' growth since the
    point before; none across a counter reset (an agent restarted) or a change of model."""
    out: list[TelemetryPoint] = []
    for point in points:
        before = out[-1] if out else None
        if point.rate_rps is None and before is not None and point.requests is not None and before.requests is not None \
                and point.model == before.model and point.ts > before.ts and point.requests >= before.requests:
            point = replace(point, rate_rps=round((point.requests - before.requests) / (point.ts - before.ts), 3))
        out.append(point)
    return out
