"""``GET /metrics``: the agent's telemetry in Prometheus text format, through ``prometheus_client``.

A collector reads, at each scrape, the same dicts the daemon publishes over MQTT (per-model
statistics from the registry, ``agent.telemetry.device_metrics``) plus the serving queue and the
bytes in flight. Every family has its HELP and TYPE, so ``promtool check metrics`` passes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import Collector

from agent.serving.pool import InferencePool

__all__ = ["CONTENT_TYPE", "AgentCollector", "metrics_renderer"]

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4  # what generate_latest writes
_QUANTILES = (("p50", "0.5"), ("p95", "0.95"), ("p99", "0.99"))
_DEVICE_GAUGES = (
    ("edge_agent_cpu_percent", "cpu_percent", "CPU use of the device in percent since the previous scrape."),
    ("edge_agent_load_1m", "load_1m", "Load average over one minute."),
    ("edge_agent_memory_total_bytes", "memory_total_bytes", "Physical memory of the device."),
    ("edge_agent_memory_used_bytes", "memory_used_bytes", "Memory in use (total less available)."),
    ("edge_agent_process_resident_bytes", "process_rss_bytes", "Resident memory of the agent process."),
)


class AgentCollector(Collector):
    """Models, serving queue and device, read when Prometheus scrapes."""

    def __init__(self, pool: InferencePool, device: Callable[[], Mapping[str, Any]] | None) -> None:
        self.pool = pool
        self.device = device

    def collect(self) -> Iterator[Metric]:
        yield from _model_metrics(self.pool.registry.telemetry())
        pending = GaugeMetricFamily("edge_agent_inference_pending_requests",
                                    "Inference requests running or waiting for a worker (HTTP and gRPC).")
        pending.add_metric([], self.pool.pending)
        held = GaugeMetricFamily("edge_agent_inference_inflight_bytes",
                                 "Bytes the requests in flight hold in the budget (JSON counted with its decoding weight).")
        held.add_metric([], self.pool.budget.used)
        yield from (pending, held)
        if self.device is not None:
            yield from _device_metrics(self.device())


def metrics_renderer(pool: InferencePool, device: Callable[[], Mapping[str, Any]] | None) -> Callable[[], bytes]:
    """A function rendering the agent's metrics (the exposition text, format 0.0.4)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AgentCollector(pool, device))
    return lambda: generate_latest(registry)


def _model_metrics(models: Mapping[str, Mapping[str, Any]]) -> Iterator[Metric]:
    info = GaugeMetricFamily("edge_agent_model_info", "Published model, its version, backend and placement.",
                             labels=["model", "version", "backend", "placement"])
    requests = CounterMetricFamily("edge_agent_inference_requests", "Inference requests served.", labels=["model"])
    errors = CounterMetricFamily("edge_agent_inference_errors", "Inference requests that failed.", labels=["model"])
    latency = Metric("edge_agent_inference_latency_seconds", "Inference latency over the window.", "summary")
    throughput = GaugeMetricFamily("edge_agent_inference_throughput_rps", "Requests per second over the window.",
                                   labels=["model"])
    for model, data in sorted(models.items()):
        placement = data.get("placement") or {}
        info.add_metric([model, str(data.get("version", "")), str(data.get("backend", "")),
                         str(placement.get("verdict", ""))], 1)
        requests.add_metric([model], data.get("requests", 0))
        errors.add_metric([model], data.get("errors", 0))
        throughput.add_metric([model], data.get("throughput_rps", 0.0))
        percentiles = data.get("latency_ms") or {}
        for key, quantile in _QUANTILES:
            if key in percentiles:
                latency.add_sample(latency.name, {"model": model, "quantile": quantile}, percentiles[key] / 1000.0)
        latency.add_sample(latency.name + "_sum", {"model": model}, data.get("latency_sum_s", 0.0))
        latency.add_sample(latency.name + "_count", {"model": model}, int(data.get("requests", 0)) - int(data.get("errors", 0)))
    yield from (info, requests, errors, latency, throughput)


def _device_metrics(device: Mapping[str, Any]) -> Iterator[Metric]:
    for name, key, help_text in _DEVICE_GAUGES:
        if device.get(key) is not None:
            yield GaugeMetricFamily(name, help_text, value=device[key])
    disk = device.get("state_disk") or {}
    for name, key, help_text in (("edge_agent_state_disk_free_bytes", "free_bytes", "Free bytes on the state directory's disk."),
                                 ("edge_agent_state_disk_total_bytes", "total_bytes", "Size of the state directory's disk.")):
        if disk.get(key) is not None:
            yield GaugeMetricFamily(name, help_text, value=disk[key])
    temperatures = device.get("temperature_c") or {}
    if temperatures:
        family = GaugeMetricFamily("edge_agent_temperature_celsius", "Temperature of each thermal zone.", labels=["sensor"])
        for sensor, celsius in sorted(temperatures.items()):
            family.add_metric([sensor], celsius)
        yield family
