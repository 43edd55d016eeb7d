"""A device's telemetry history: the figures the console's device page charts, one point per kept report.

Agents publish a telemetry report every few seconds (``agent/daemon.py``; light agents in
``edgectl/sim.py`` send the same shape): ``device`` (``cpu_percent``, ``memory_percent``, ...) and
``models`` (per published model: ``version``, ``requests``, ``latency_ms`` p50/p95/p99, ``throughput_rps``).
A point keeps the device's CPU and memory, the latency of the model that served the most requests in the
report's window, and the device's inference rate: the agents' ``throughput_rps`` summed over models, or
(a light agent sends counters only) the growth of the request counters between two points.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from edgecore.protocol.reports import ModelTelemetry, Telemetry

__all__ = ["TelemetryPoint", "telemetry_point", "with_rates"]


@dataclass(frozen=True)
class TelemetryPoint:
    device_id: str
    ts: float  # when the controller received the report (its own clock); the device's claimed time is kept apart
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


def _served(stats: ModelTelemetry) -> float:
    return stats.window_requests or stats.requests or 0


def telemetry_point(report: Telemetry, ts: float) -> TelemetryPoint:
    """The history point of one telemetry report; figures the report lacks are None."""
    point = TelemetryPoint(report.device_id, ts, cpu_percent=report.device.cpu_percent,
                           memory_percent=report.device.memory_percent)
    stats = report.models
    if not stats:
        return point
    name = max(sorted(stats), key=lambda n: _served(stats[n]))
    main = stats[name]
    counts = [s.requests for s in stats.values() if s.requests is not None]
    rates = [s.throughput_rps for s in stats.values() if s.throughput_rps is not None]
    return replace(point, model=name, version=int(main.version) if main.version.isdigit() else None,
                   p50_ms=main.latency_ms.p50, p95_ms=main.latency_ms.p95, requests=sum(counts) if counts else None,
                   rate_rps=sum(rates) if rates else None)


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
