"""Latency baselines for the ``p95_latency`` ratio gate: what a device's previous model took, or what is known of it.

The ratio is the new model's p95 over the previous model's p95, like with like (telemetry against
telemetry, else health check against health check). The baseline is the device's own figure when the
store has one; a device that ran a previous model whose latency it never reported (it joined the fleet
just before the rollout, or its telemetry was lost) is compared with what the store knows of that
previous model on the rollout's other devices of the same variant (so the same target): the median of
their latest figures. A device with neither is reported as missing, and the gate has no data (it is
held, never left out of the median). A device that ran no model before has nothing to compare with.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from edgectl.controller.records import ModelRef, PackageRef, RolloutDevice, RolloutRow
from edgectl.controller.store import Store

__all__ = ["Baselines", "LatencyFacts"]

SOURCES = ("telemetry", "health")
FLEET_SAMPLE = 100  # devices whose figures make the fleet's baseline: a median needs no more
CACHE_S = 30.0  # the fleet's baseline changes slowly; asked on every tick, it is computed at most this often


@dataclass(frozen=True)
class LatencyFacts:
    """One device's latency on the new model and its ratio to the baseline (``baseline``: own, fleet or none)."""

    p95_ms: float | None = None
    ratio: float | None = None
    baseline: str = ""
    missing: bool = False  # it ran a previous model and no baseline for it is known: the gate waits


class Baselines:
    def __init__(self, store: Store, clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.clock = clock
        self._fleet: dict[tuple[str, str, str, int, str], tuple[float, float | None]] = {}

    def facts(self, rollout: RolloutRow, row: RolloutDevice, package: PackageRef) -> LatencyFacts:
        since = (row.installed_at or 0) - 1
        new: dict[str, float] = {}
        for point in self.store.latency(row.device_id, package.name, package.version, since=since):
            new[point.source] = point.p95_ms  # oldest first: the newest of each source stays
        p95 = next((new[s] for s in SOURCES if s in new), None)
        prev = row.previous
        if not prev.name or prev.version is None:
            return LatencyFacts(p95)
        for source in (s for s in SOURCES if s in new):
            old = self._latest(row.device_id, prev, source)
            if old:
                return LatencyFacts(p95, new[source] / old, "own")
        for source in (s for s in SOURCES if s in new):
            known = self.fleet(rollout, row, source)
            if known:
                return LatencyFacts(p95, new[source] / known, "fleet")
        return LatencyFacts(p95, missing=True)

    def fleet(self, rollout: RolloutRow, row: RolloutDevice, source: str) -> float | None:
        """Median of the latest ``source`` p95 of ``row``'s previous model on the rollout's devices of its variant."""
        prev = row.previous
        assert prev.name is not None and prev.version is not None
        key = (rollout.id, row.variant, prev.name, prev.version, source)
        cached = self._fleet.get(key)
        if cached is not None and self.clock() - cached[0] < CACHE_S:
            return cached[1]
        peers = [r.device_id for r in self.store.rollout_devices(rollout.id)
                 if r.variant == row.variant and r.previous == prev and r.device_id != row.device_id]
        figures = [f for f in (self._latest(d, prev, source) for d in peers[:FLEET_SAMPLE]) if f]
        value = statistics.median(figures) if figures else None
        self._fleet[key] = (self.clock(), value)
        return value

    def _latest(self, device_id: str, model: ModelRef, source: str) -> float | None:
        assert model.name is not None and model.version is not None
        points = [p.p95_ms for p in self.store.latency(device_id, model.name, model.version, limit=50) if p.source == source]
        return points[-1] if points and points[-1] > 0 else None
