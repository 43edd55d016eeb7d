"""What a controller says about itself: store, lease, broker, ingest buffer, subscriptions, reconciliation.

The service updates one :class:`ControllerHealth`; the REST API's ``/api/v1/health`` shows
:meth:`ControllerHealth.snapshot` (``status`` is ``ok``, ``degraded`` with the problems named, or
``unavailable`` while the store is) and ``/metrics`` exports it through :class:`HealthCollector`
(names in :data:`HEALTH_METRICS`, docs/api.md).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["HEALTH_METRICS", "ControllerHealth", "HealthCollector", "Probes"]

HEALTH_METRICS = (
    "edgectl_controller_store_up", "edgectl_controller_store_outages_total", "edgectl_controller_leading",
    "edgectl_controller_lease_epoch", "edgectl_controller_broker_connected", "edgectl_ingest_buffer_bytes",
    "edgectl_controller_subscription_silent", "edgectl_reconciliations_total", "edgectl_reconciled_reports_total",
    "edgectl_devices_clock_off",
)


@dataclass
class Probes:
    """What the health reads live from the service, when asked."""

    leading: Callable[[], bool] = lambda: False
    epoch: Callable[[], int | None] = lambda: None
    broker: Callable[[], bool] = lambda: False
    buffered: Callable[[], tuple[int, int]] = lambda: (0, 0)  # messages, bytes waiting to be ingested
    clock_off: Callable[[], int] = lambda: 0  # devices whose claimed time is far off


@dataclass
class ControllerHealth:
    """Updated by the service's loop; read by the API's threads (every change under ``lock``)."""

    probes: Probes = field(default_factory=Probes)
    store_error: str | None = None  # why the store is unavailable now; None while it answers
    store_down_since: float | None = None  # wall clock, for people
    outages: int = 0
    silent: dict[str, str] = field(default_factory=dict)  # subscription filter -> what it should bring and does not
    reconciliations: int = 0
    reconciled: dict[str, int] = field(default_factory=dict)  # leaf -> retained reports the store lacked
    lock: threading.Lock = field(default_factory=threading.Lock)

    def store_lost(self, reason: str) -> bool:
        """The store failed; True when it was up until now (the caller logs the change once)."""
        with self.lock:
            first = self.store_error is None
            if first:
                self.outages += 1
                self.store_down_since = time.time()
            self.store_error = reason
            return first

    def store_back(self) -> float | None:
        """The store answers again; how long it was down (None when it was not)."""
        with self.lock:
            if self.store_error is None or self.store_down_since is None:
                return None
            down = time.time() - self.store_down_since
            self.store_error, self.store_down_since = None, None
            return down

    def subscription(self, topic_filter: str, problem: str | None) -> None:
        with self.lock:
            if problem is None:
                self.silent.pop(topic_filter, None)
            else:
                self.silent[topic_filter] = problem

    def reconciliation(self, found: dict[str, int]) -> None:
        with self.lock:
            self.reconciliations += 1
            for leaf, n in found.items():
                self.reconciled[leaf] = self.reconciled.get(leaf, 0) + n

    def problems(self) -> list[str]:
        with self.lock:
            found = [f"store unavailable: {self.store_error}"] if self.store_error else []
            found += [f"subscription {topic}: {problem}" for topic, problem in sorted(self.silent.items())]
        if not self.probes.broker():
            found.append("not connected to the broker")
        return found

    def snapshot(self) -> dict[str, Any]:
        problems = self.problems()
        messages, waiting = self.probes.buffered()
        with self.lock:
            status = "unavailable" if self.store_error else "degraded" if problems else "ok"
            return {
                "status": status, "problems": problems,
                "store": {"up": self.store_error is None, "error": self.store_error, "down_since": self.store_down_since,
                          "outages": self.outages},
                "leader": {"leading": self.probes.leading(), "epoch": self.probes.epoch()},
                "broker": {"connected": self.probes.broker()},
                "ingest": {"buffered_messages": messages, "buffered_bytes": waiting, "silent": dict(self.silent),
                           "devices_clock_off": self.probes.clock_off()},
                "reconciliation": {"runs": self.reconciliations, "found": dict(self.reconciled)},
            }


class HealthCollector(Collector):
    """The health as Prometheus series (they need no store: they are there while it is down)."""

    def __init__(self, health: ControllerHealth) -> None:
        self.health = health

    def collect(self) -> Iterator[Metric]:
        h = self.health
        snap = h.snapshot()
        yield _gauge("edgectl_controller_store_up", "1 while the store answers, 0 while it is unavailable.",
                     1.0 if snap["store"]["up"] else 0.0)
        outages = CounterMetricFamily("edgectl_controller_store_outages", "Times the store became unavailable.")
        outages.add_metric([], snap["store"]["outages"])
        yield outages
        yield _gauge("edgectl_controller_leading", "1 while this controller holds the engine lease.",
                     1.0 if snap["leader"]["leading"] else 0.0)
        epoch = snap["leader"]["epoch"]
        if epoch is not None:
            yield _gauge("edgectl_controller_lease_epoch", "The fencing number of the lease this controller holds.", epoch)
        yield _gauge("edgectl_controller_broker_connected", "1 while connected to the broker.",
                     1.0 if snap["broker"]["connected"] else 0.0)
        yield _gauge("edgectl_ingest_buffer_bytes", "Bytes of device messages received and not stored yet.",
                     snap["ingest"]["buffered_bytes"])
        silent = GaugeMetricFamily("edgectl_controller_subscription_silent",
                                   "1 for a subscription that brings nothing its configuration promises.", labels=["filter"])
        for topic in snap["ingest"]["silent"]:
            silent.add_metric([topic], 1.0)
        yield silent
        runs = CounterMetricFamily("edgectl_reconciliations", "Comparisons of the broker's retained reports with the store.")
        runs.add_metric([], snap["reconciliation"]["runs"])
        yield runs
        found = CounterMetricFamily("edgectl_reconciled_reports", "Retained reports the store lacked, found by reconciliation.",
                                    labels=["leaf"])
        for leaf, n in sorted(snap["reconciliation"]["found"].items()):
            found.add_metric([leaf], n)
        yield found
        yield _gauge("edgectl_devices_clock_off", "Devices whose reports claim a time far from the controller's.",
                     snap["ingest"]["devices_clock_off"])


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc)
    family.add_metric([], value)
    return family
