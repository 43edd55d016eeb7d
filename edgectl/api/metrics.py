"""``/metrics``: the fleet and the controller in Prometheus text format, read from the store at scrape time.

Gauges come from a collector that asks the store when Prometheus scrapes, so every controller
replica (or a lone ``edgectl api serve``) reports the same fleet. Wave and gate series exist for
active rollouts only, which bounds their label sets. Names are listed in :data:`METRICS`
(docs/api.md); the shipped Grafana dashboard queries only these.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from edgectl.api.context import ApiContext
from edgectl.controller.records import ACTIVE, RolloutStatus
from edgectl.controller.store.protocol import StoreUnavailable
from edgectl.fleet import rollout_gates, rollout_summary, rollout_waves, waiting_for_data

__all__ = ["METRICS", "FleetCollector", "render"]

LAG_WINDOW_S = 60.0
METRICS = (
    "edgectl_devices", "edgectl_rollouts", "edgectl_rollout_current_wave", "edgectl_rollout_waves",
    "edgectl_rollout_wave_devices", "edgectl_rollout_wave_progress_ratio", "edgectl_rollout_gate_value",
    "edgectl_rollout_gate_threshold", "edgectl_rollout_gate_holds", "edgectl_rollout_gate_no_data",
    "edgectl_rollout_data_deadline_seconds", "edgectl_ingest_lag_seconds",
    "edgectl_store_query_seconds", "edgectl_api_requests_total", "edgectl_api_request_seconds",
    "edgectl_ingest_queue_messages", "edgectl_ingested_messages_total", "edgectl_dropped_messages_total",
    "edgectl_stored_reports_total",
)


class FleetCollector(Collector):
    """Devices, rollouts, waves, gates and ingest lag, from the store at each scrape."""

    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx

    def collect(self) -> Iterator[Metric]:
        for part in (self._devices, self._rollouts, self._ingest):
            try:
                found = list(part())
            except StoreUnavailable:  # scraped while the store is down: the controller's health series say so
                continue
            yield from found

    def _devices(self) -> Iterator[Metric]:
        devices = GaugeMetricFamily("edgectl_devices", "Devices by target and presence (online, offline, unknown).",
                                    labels=["target", "status"])
        with self.ctx.timer.time("device_counts"):
            counts = self.ctx.store.device_counts()
        for (target, status), n in sorted(counts.items()):
            devices.add_metric([target or "unknown", status], n)
        yield devices

    def _rollouts(self) -> Iterator[Metric]:
        store = self.ctx.store
        with self.ctx.timer.time("rollouts"):
            rollouts = store.rollouts()
        by_status = GaugeMetricFamily("edgectl_rollouts", "Rollouts by status.", labels=["status"])
        counts = Counter(r.status.value for r in rollouts)
        for status in RolloutStatus:
            by_status.add_metric([status.value], counts[status.value])
        yield by_status
        current = GaugeMetricFamily("edgectl_rollout_current_wave", "Wave an active rollout is in.", labels=["rollout"])
        total = GaugeMetricFamily("edgectl_rollout_waves", "Waves of an active rollout.", labels=["rollout"])
        wave_devices = GaugeMetricFamily("edgectl_rollout_wave_devices", "Devices of an active rollout's wave by status.",
                                         labels=["rollout", "wave", "status"])
        progress = GaugeMetricFamily("edgectl_rollout_wave_progress_ratio", "Share of a wave's devices that finished.",
                                     labels=["rollout", "wave"])
        value = GaugeMetricFamily("edgectl_rollout_gate_value", "A gate's measured value over the current wave "
                                  "(fraction, seconds, ratio or ms as its threshold).", labels=["rollout", "gate", "metric"])
        threshold = GaugeMetricFamily("edgectl_rollout_gate_threshold", "A gate's threshold.",
                                      labels=["rollout", "gate", "metric"])
        holds = GaugeMetricFamily("edgectl_rollout_gate_holds", "1 while a gate holds, 0 when it fails or has no data.",
                                  labels=["rollout", "gate", "metric"])
        no_data = GaugeMetricFamily("edgectl_rollout_gate_no_data", "1 while a gate has no data (it holds the wave "
                                    "unless the rollout allows promotion without data), else 0.",
                                    labels=["rollout", "gate", "metric"])
        deadline = GaugeMetricFamily("edgectl_rollout_data_deadline_seconds", "While a baked wave waits for a gate's "
                                     "data: the Unix time it halts without it.", labels=["rollout", "wave"])
        for rollout in (r for r in rollouts if r.status in ACTIVE):
            with self.ctx.timer.time("rollout_devices"):
                summary = rollout_summary(store, rollout.id)
                gates = rollout_gates(store, rollout)
            current.add_metric([rollout.id], rollout.wave)
            total.add_metric([rollout.id], rollout.spec.wave_count)
            for wave in rollout_waves(summary):
                for status, n in wave["by_status"].items():
                    wave_devices.add_metric([rollout.id, str(wave["wave"]), status], n)
                progress.add_metric([rollout.id, str(wave["wave"])], wave["finished"] / max(wave["devices"], 1))
            for g in gates:
                labels = [rollout.id, g["gate"], g["metric"]]
                threshold.add_metric(labels, g["threshold"])
                holds.add_metric(labels, 1.0 if g["holds"] else 0.0)
                no_data.add_metric(labels, 1.0 if g["verdict"] == "no data" else 0.0)
                if g["value"] is not None:
                    value.add_metric(labels, g["value"])
            waiting = waiting_for_data(rollout, gates)
            if waiting is not None:
                deadline.add_metric([rollout.id, str(waiting["wave"])], waiting["deadline"])
        yield from (current, total, wave_devices, progress, value, threshold, holds, no_data, deadline)

    def _ingest(self) -> Iterator[Metric]:
        lag = GaugeMetricFamily("edgectl_ingest_lag_seconds", "Seconds from a device's telemetry report to the store, "
                                f"over reports of the last {LAG_WINDOW_S:.0f}s (median and max).", labels=["stat"])
        with self.ctx.timer.time("ingest_lags"):
            lags = self.ctx.store.ingest_lags(time.time() - LAG_WINDOW_S)
        if lags:
            lag.add_metric(["median"], max(0.0, statistics.median(lags)))
            lag.add_metric(["max"], max(0.0, max(lags)))
        yield lag
        controller = self.ctx.controller
        if controller is None:
            return
        queue = GaugeMetricFamily("edgectl_ingest_queue_messages", "Device messages received, waiting for the store.")
        queue.add_metric([], controller.inbox.qsize())
        ingested = CounterMetricFamily("edgectl_ingested_messages", "Device messages this controller ingested (on a "
                                       "broker without shared subscriptions every replica ingests every report).")
        ingested.add_metric([], controller.messages)
        stored = CounterMetricFamily("edgectl_stored_reports", "Telemetry reports this controller kept in the history "
                                     "(about one per device every 5 s); one another replica kept first is not counted, "
                                     "so the sum over replicas is the fleet's.")
        stored.add_metric([], controller.ingest.stored)
        dropped = CounterMetricFamily("edgectl_dropped_messages", "Device messages dropped unparsed or refused.",
                                    labels=["reason"])
        drops = getattr(controller, "drops", None)
        for reason, n in sorted((drops.counts() if drops is not None else {}).items()):
            dropped.add_metric([reason], n)
        yield from (queue, ingested, stored, dropped)


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
