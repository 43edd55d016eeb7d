"""The telemetry report (protocol v1): device metrics and each served model's figures.

Part of :mod:`edgecore.protocol.reports`, which re-exports these classes and reads every report.
Figures a device does not measure are None and left out of the JSON.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from edgecore.protocol.schema import Fields, decode_json, encode_json
from edgecore.protocol.topics import validate_id

__all__ = ["DeviceMetrics", "LatencyFigures", "ModelTelemetry", "StateDisk", "Telemetry"]


def _without_none(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if v is not None}


@dataclass(frozen=True)
class LatencyFigures:
    """Latency percentiles in milliseconds over a model's window; None where the window held no request."""

    p50: float | None = None
    p95: float | None = None
    p99: float | None = None

    def to_json(self) -> dict[str, Any]:
        return _without_none({"p50": self.p50, "p95": self.p95, "p99": self.p99})

    @classmethod
    def read(cls, f: Fields) -> LatencyFigures:
        return cls(f.opt_number("p50"), f.opt_number("p95"), f.opt_number("p99"))


@dataclass(frozen=True)
class ModelTelemetry:
    """One served model in a telemetry report: counters since it was published, figures over its window."""

    version: str
    backend: str = ""
    requests: int | None = None
    errors: int | None = None
    latency_ms: LatencyFigures = field(default_factory=LatencyFigures)
    throughput_rps: float | None = None
    window_requests: int | None = None
    latency_sum_s: float | None = None
    placement: dict[str, Any] = field(default_factory=dict)  # shown as it is
    info: dict[str, Any] = field(default_factory=dict)  # shown as it is
    kind: str = "model"  # or "pipeline" (whose backend is "pipeline": its steps run on their models' backends)
    footprint_mb: float | None = None  # resident MiB the model takes on its serving backend (measured on the device)
    selection: dict[str, Any] | None = None  # this model's backend selection, shown as it is

    def to_json(self) -> dict[str, Any]:
        return _without_none({
            "version": self.version, "backend": self.backend, "requests": self.requests, "errors": self.errors,
            "latency_ms": self.latency_ms.to_json(), "throughput_rps": self.throughput_rps,
            "window_requests": self.window_requests, "latency_sum_s": self.latency_sum_s,
            "placement": self.placement or None, "info": self.info or None, "kind": self.kind,
            "footprint_mb": self.footprint_mb, "selection": self.selection})

    @classmethod
    def read(cls, f: Fields) -> ModelTelemetry:
        latency = f.opt_obj("latency_ms")
        return cls(f.text("version", 32), f.opt_text("backend", 256) or "", f.opt_integer("requests"),
                   f.opt_integer("errors"), LatencyFigures() if latency is None else LatencyFigures.read(latency),
                   f.opt_number("throughput_rps"), f.opt_integer("window_requests"), f.opt_number("latency_sum_s"),
                   f.opt_raw_obj("placement") or {}, f.opt_raw_obj("info") or {}, f.opt_text("kind", 16) or "model",
                   f.opt_number("footprint_mb"), f.opt_raw_obj("selection"))

    @classmethod
    def from_json(cls, data: Any, what: str = "telemetry.models") -> ModelTelemetry:
        return cls.read(Fields(data, what))


@dataclass(frozen=True)
class StateDisk:
    """The disk that holds the agent's state directory."""

    path: str
    total_bytes: int
    free_bytes: int
    used_percent: float

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "total_bytes": self.total_bytes, "free_bytes": self.free_bytes,
                "used_percent": self.used_percent}

    @classmethod
    def read(cls, f: Fields) -> StateDisk:
        return cls(f.text("path", 4096), f.integer("total_bytes"), f.integer("free_bytes"), f.number("used_percent"))


@dataclass(frozen=True)
class DeviceMetrics:
    """CPU, memory, temperatures and disk of the device; None where the device does not measure it."""

    cpu_percent: float | None = None
    load_1m: float | None = None
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    memory_percent: float | None = None
    process_rss_bytes: int | None = None
    temperature_c: dict[str, float] = field(default_factory=dict)  # "zone:type" -> degrees
    state_disk: StateDisk | None = None
    simulated: bool = False  # a light simulated agent's figures (edgectl sim)

    def to_json(self) -> dict[str, Any]:
        return _without_none({
            "cpu_percent": self.cpu_percent, "load_1m": self.load_1m, "memory_total_bytes": self.memory_total_bytes,
            "memory_used_bytes": self.memory_used_bytes, "memory_percent": self.memory_percent,
            "process_rss_bytes": self.process_rss_bytes, "temperature_c": self.temperature_c or None,
            "state_disk": None if self.state_disk is None else self.state_disk.to_json(), "simulated": self.simulated or None})

    @classmethod
    def read(cls, f: Fields) -> DeviceMetrics:
        disk = f.opt_obj("state_disk")
        return cls(f.opt_number("cpu_percent"), f.opt_number("load_1m"), f.opt_integer("memory_total_bytes"),
                   f.opt_integer("memory_used_bytes"), f.opt_number("memory_percent"), f.opt_integer("process_rss_bytes"),
                   f.entries("temperature_c", Fields.number), None if disk is None else StateDisk.read(disk),
                   f.boolean("simulated") if f.data.get("simulated") is not None else False)


@dataclass(frozen=True)
class Telemetry:
    """A periodic report (QoS 0, not retained): device metrics, each served model's figures, refused messages."""

    LEAF: ClassVar[str] = "telemetry"
    QOS: ClassVar[int] = 0
    RETAIN: ClassVar[bool] = False

    device_id: str
    ts: float | None = None
    device: DeviceMetrics = field(default_factory=DeviceMetrics)
    models: dict[str, ModelTelemetry] = field(default_factory=dict)
    selection: dict[str, Any] | None = None  # the served model's backend selection when it is the only one (shown)
    rejected_messages: dict[str, int] = field(default_factory=dict)  # error kind -> messages refused

    def to_json(self) -> dict[str, Any]:
        return {"device_id": self.device_id, "ts": self.ts, "device": self.device.to_json(),
                "models": {name: m.to_json() for name, m in self.models.items()}, "selection": self.selection,
                "rejected_messages": self.rejected_messages}

    def to_payload(self) -> bytes:
        return encode_json(self.to_json())

    @classmethod
    def from_payload(cls, raw: bytes) -> Telemetry:
        return cls._read(decode_json(raw, cls.LEAF))

    @classmethod
    def from_json(cls, data: Any) -> Telemetry:
        return cls._read(Fields(data, cls.LEAF))

    @classmethod
    def _read(cls, f: Fields) -> Telemetry:
        device, models = f.opt_obj("device"), f.opt_obj("models")
        return cls(validate_id(f.text("device_id", 64)), f.opt_number("ts"),
                   DeviceMetrics() if device is None else DeviceMetrics.read(device),
                   {} if models is None else {name: ModelTelemetry.read(models.obj(name)) for name in models.data},
                   f.opt_raw_obj("selection"), f.entries("rejected_messages", Fields.integer))
