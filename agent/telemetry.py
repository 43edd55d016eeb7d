"""Telemetry: per-model request statistics, device metrics, and their Prometheus text form.

The same dicts go to MQTT (the daemon publishes them) and to ``GET /metrics``.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from agent.hardware.thermal import probe_thermal

__all__ = ["ModelStats", "device_metrics", "prometheus_text"]


class ModelStats:
    """Thread-safe counters and a sliding window of latencies for one published model.

    The window keeps at most ``max_samples`` requests no older than ``window_s`` seconds;
    percentiles and throughput are computed over it, counters over the model's lifetime.
    """

    def __init__(
        self,
        window_s: float = 60.0,
        max_samples: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window_s = window_s
        self._clock = clock
        self._lock = threading.Lock()
        self._window: deque[tuple[float, float]] = deque(maxlen=max_samples)
        self._started = clock()
        self.requests = 0
        self.errors = 0
        self.latency_sum_s = 0.0

    def record(self, latency_s: float, ok: bool = True) -> None:
        """Count one request; only successful ones enter the latency window."""
        now = self._clock()
        with self._lock:
            self.requests += 1
            if not ok:
                self.errors += 1
                return
            self.latency_sum_s += latency_s
            self._window.append((now, latency_s))

    def snapshot(self) -> dict[str, Any]:
        """Counters, p50/p95/p99 latency in ms and throughput over the window."""
        now = self._clock()
        with self._lock:
            while self._window and self._window[0][0] < now - self.window_s:
                self._window.popleft()
            latencies = np.array([lat for _, lat in self._window], dtype=np.float64)
            requests, errors, total = self.requests, self.errors, self.latency_sum_s
        span = min(self.window_s, max(now - self._started, 1e-9))
        quantiles = (
            np.percentile(latencies * 1000.0, [50, 95, 99]).tolist() if latencies.size else []
        )
        return {
            "requests": requests,
            "errors": errors,
            "latency_sum_s": round(total, 6),
            "latency_ms": dict(zip(("p50", "p95", "p99"), (round(q, 3) for q in quantiles), strict=False)),
            "window_requests": int(latencies.size),
            "throughput_rps": round(latencies.size / span, 3),
        }


def device_metrics(state_dir: Path, hardware_root: Path = Path("/")) -> dict[str, Any]:
    """CPU, memory, this process's RSS, temperatures and the state directory's disk.

    ``cpu_percent`` is measured since the previous call (the first call in a process reads 0).
    """
    memory = psutil.virtual_memory()
    disk = shutil.disk_usage(_existing_parent(Path(state_dir)))
    return {
        "cpu_percent": psutil.cpu_percent(interval=None),
        "load_1m": round(os.getloadavg()[0], 3),
        "memory_total_bytes": memory.total,
        "memory_used_bytes": memory.total - memory.available,
        "memory_percent": memory.percent,
        "process_rss_bytes": psutil.Process().memory_info().rss,
        "temperature_c": {
            f"{zone.zone}:{zone.type}": zone.celsius for zone in probe_thermal(Path(hardware_root))
        },
        "state_disk": {
            "path": str(state_dir),
            "total_bytes": disk.total,
            "free_bytes": disk.free,
            "used_percent": round(100.0 * (disk.total - disk.free) / disk.total, 2) if disk.total else 0.0,
        },
    }


def prometheus_text(models: Mapping[str, Mapping[str, Any]], device: Mapping[str, Any] | None) -> str:
    """Prometheus text exposition (format 0.0.4) of model telemetry and device metrics."""
    lines: list[str] = []
    _model_metrics(lines, models)
    if device:
        _device_lines(lines, device)
    return "\n".join(lines) + "\n"


def _model_metrics(lines: list[str], models: Mapping[str, Mapping[str, Any]]) -> None:
    families = [
        ("edge_agent_model_info", "gauge", "Published model, its version, backend and placement."),
        ("edge_agent_inference_requests_total", "counter", "Inference requests served."),
        ("edge_agent_inference_errors_total", "counter", "Inference requests that failed."),
        ("edge_agent_inference_latency_seconds", "summary", "Inference latency over the window."),
        ("edge_agent_inference_throughput_rps", "gauge", "Requests per second over the window."),
    ]
    for name, kind, help_text in families:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        for model, data in sorted(models.items()):
            lines += _model_samples(name, model, data)


def _model_samples(family: str, model: str, data: Mapping[str, Any]) -> list[str]:
    labels = {"model": model}
    if family == "edge_agent_model_info":
        placement = data.get("placement") or {}
        info = {
            **labels,
            "version": str(data.get("version", "")),
            "backend": str(data.get("backend", "")),
            "placement": str(placement.get("verdict", "")),
        }
        return [f"{family}{_labels(info)} 1"]
    if family == "edge_agent_inference_requests_total":
        return [f"{family}{_labels(labels)} {data.get('requests', 0)}"]
    if family == "edge_agent_inference_errors_total":
        return [f"{family}{_labels(labels)} {data.get('errors', 0)}"]
    if family == "edge_agent_inference_throughput_rps":
        return [f"{family}{_labels(labels)} {data.get('throughput_rps', 0.0)}"]
    samples = [
        f"{family}{_labels({**labels, 'quantile': q})} {ms / 1000.0}"
        for q, ms in zip(("0.5", "0.95", "0.99"), (data.get("latency_ms") or {}).values(), strict=False)
    ]
    ok = int(data.get("requests", 0)) - int(data.get("errors", 0))
    samples.append(f"{family}_sum{_labels(labels)} {data.get('latency_sum_s', 0.0)}")
    samples.append(f"{family}_count{_labels(labels)} {ok}")
    return samples


def _device_lines(lines: list[str], device: Mapping[str, Any]) -> None:
    gauges = {
        "edge_agent_cpu_percent": device.get("cpu_percent"),
        "edge_agent_load_1m": device.get("load_1m"),
        "edge_agent_memory_total_bytes": device.get("memory_total_bytes"),
        "edge_agent_memory_used_bytes": device.get("memory_used_bytes"),
        "edge_agent_process_resident_bytes": device.get("process_rss_bytes"),
        "edge_agent_state_disk_free_bytes": (device.get("state_disk") or {}).get("free_bytes"),
        "edge_agent_state_disk_total_bytes": (device.get("state_disk") or {}).get("total_bytes"),
    }
    for name, value in gauges.items():
        if value is not None:
            lines += [f"# TYPE {name} gauge", f"{name} {value}"]
    temps = device.get("temperature_c") or {}
    if temps:
        lines.append("# TYPE edge_agent_temperature_celsius gauge")
        for sensor, celsius in sorted(temps.items()):
            lines.append(f"edge_agent_temperature_celsius{_labels({'sensor': sensor})} {celsius}")


def _labels(labels: Mapping[str, str]) -> str:
    def escape(value: str) -> str:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    return "{" + ",".join(f'{k}="{escape(str(v))}"' for k, v in labels.items()) + "}"


def _existing_parent(path: Path) -> Path:
    """The path itself or its nearest existing ancestor (the state dir may not exist yet)."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path
