"""Telemetry: per-model request statistics and device metrics (agent/serving/metrics.py writes /metrics).

The daemon publishes the same figures over MQTT as :class:`edgecore.protocol.reports.Telemetry`.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from agent.hardware.thermal import probe_thermal
from edgecore.protocol.reports import DeviceMetrics, StateDisk

__all__ = ["ModelStats", "device_metrics"]


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


def device_metrics(state_dir: Path, hardware_root: Path = Path("/")) -> DeviceMetrics:
    """CPU, memory, this process's RSS, temperatures and the state directory's disk.

    ``cpu_percent`` is measured since the previous call (the first call in a process reads 0).
    """
    memory = psutil.virtual_memory()
    disk = shutil.disk_usage(_existing_parent(Path(state_dir)))
    return DeviceMetrics(
        cpu_percent=psutil.cpu_percent(interval=None),
        load_1m=round(os.getloadavg()[0], 3),
        memory_total_bytes=memory.total,
        memory_used_bytes=memory.total - memory.available,
        memory_percent=memory.percent,
        process_rss_bytes=psutil.Process().memory_info().rss,
        temperature_c={f"{zone.zone}:{zone.type}": zone.celsius for zone in probe_thermal(Path(hardware_root))},
        state_disk=StateDisk(
            str(state_dir), disk.total, disk.free,
            round(100.0 * (disk.total - disk.free) / disk.total, 2) if disk.total else 0.0,
        ),
    )


def _existing_parent(path: Path) -> Path:
    """The path itself or its nearest existing ancestor (the state dir may not exist yet)."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path
