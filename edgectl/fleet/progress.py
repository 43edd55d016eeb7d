"""Where a rollout stands, for status views: per-wave progress and each gate's value against its threshold."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from edgectl.controller.gates import parse_gates
from edgectl.controller.records import COUNTED_FAILED, FINAL, FINISHED, RolloutDevice, RolloutRow
from edgectl.controller.store import Store
from edgectl.fleet.rollouts import rollout_summary

__all__ = ["rollout_gates", "rollout_status", "rollout_waves"]


def rollout_waves(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Each wave of a :func:`rollout_summary`: its devices by status, how many finished, and whether it is
    ``done``, ``current`` or ``pending``."""
    finished, failed = {s.value for s in FINISHED}, {s.value for s in COUNTED_FAILED}
    waves = []
    for wave in range(1, summary["waves"] + 1):
        counts = Counter(d["status"] for d in summary["devices"] if d["wave"] == wave)
        current = wave == summary["wave"] and summary["status"] not in FINAL
        state = "pending" if wave > summary["wave"] else "current" if current else "done"
        waves.append({"wave": wave, "devices": sum(counts.values()), "finished": sum(counts[s] for s in finished),
                      "ok": counts["ok"], "failed": sum(counts[s] for s in failed), "by_status": dict(sorted(counts.items())),
                      "state": state})
    return waves


class _ReadOnly:
    """A publisher for measuring gates: measuring never reaches a device."""

    def desired(self, rollout: RolloutRow, row: RolloutDevice, cancel: bool = False) -> bytes:
        raise RuntimeError("gate measurement must not publish")

    def rollback(self, rollout: RolloutRow, device_id: str) -> tuple[bool, bytes]:
        raise RuntimeError("gate measurement must not publish")

    def send(self, device_id: str, leaf: str, payload: bytes) -> bool:
        raise RuntimeError("gate measurement must not publish")

    def expect(self, rollout: RolloutRow, rows: list[RolloutDevice]) -> None:
        raise RuntimeError("gate measurement must not publish")


def rollout_gates(store: Store, rollout: RolloutRow) -> list[dict[str, Any]]:
    """The gates over the rollout's current wave, measured now as the engine measures them (changing nothing)."""
    from edgectl.controller.engine import Engine  # the engine's facts, not a second reading of them
    from edgectl.controller.service import backend_fallback

    rows = [r for r in store.rollout_devices(rollout.id) if r.wave == rollout.wave]
    results = Engine(store, _ReadOnly(), backend_fallback).gate_values(rollout, rows)
    return [{"wave": rollout.wave, "gate": g.text, "metric": g.metric, "op": g.op, "threshold": g.threshold, "unit": g.unit,
             "value": r.value if r.value is None or math.isfinite(r.value) else None, "holds": r.holds, "detail": r.detail}
            for g, r in zip(parse_gates(rollout.spec.gates), results, strict=True)]


def rollout_status(store: Store, rollout_id: str) -> dict[str, Any]:
    """:func:`rollout_summary` plus ``progress`` (per wave) and ``gate_values`` (each gate against its threshold)."""
    summary = rollout_summary(store, rollout_id)
    rollout = store.rollout(rollout_id)
    assert rollout is not None  # rollout_summary raised NotFoundError otherwise
    return {**summary, "progress": rollout_waves(summary), "gate_values": rollout_gates(store, rollout)}
