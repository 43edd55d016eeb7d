"""Where a rollout stands, for status views: per-wave progress and each gate's value against its threshold."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from edgectl.controller.gates import Verdict, parse_gates
from edgectl.controller.records import COUNTED_FAILED, FINAL, FINISHED, Phase, RolloutDevice, RolloutRow
from edgectl.controller.sets import SetMessage
from edgectl.controller.store import Store
from edgectl.fleet.rollouts import rollout_summary

__all__ = ["rolled_back_by", "rollout_gates", "rollout_status", "rollout_waves", "waiting_for_data"]


def rollout_waves(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Each wave of a :func:`rollout_summary`: its devices by status, how many finished, and whether it is
    ``done``, ``current`` or ``pending`` (planned, not started).

    ``failed`` counts the devices that failed; those the controller rolled back on its own command (after a
    halt, or the operator's abort: ``rolled_back_by``) are ``rolled_back``, apart; ``installing`` counts the
    devices sent the update and not finished, ``planned`` those not sent yet, ``deferred`` the offline ones."""
    finished, failed = {s.value for s in FINISHED}, {s.value for s in COUNTED_FAILED} - set(_ROLLED_BACK)
    by = rolled_back_by(summary)
    waves = []
    for wave in range(1, summary["waves"] + 1):
        counts = Counter(d["status"] for d in summary["devices"] if d["wave"] == wave)
        current = wave == summary["wave"] and summary["status"] not in FINAL
        state = "pending" if wave > summary["wave"] else "current" if current else "done"
        rolled_back = sum(counts[s] for s in _ROLLED_BACK)
        waves.append({"wave": wave, "devices": sum(counts.values()), "finished": sum(counts[s] for s in finished),
                      "ok": counts["ok"], "failed": sum(counts[s] for s in failed), "rolled_back": rolled_back,
                      "rolled_back_by": by if rolled_back else None, "installing": counts["sent"] + counts["running"],
                      "planned": counts["planned"], "deferred": counts["deferred"], "by_status": dict(sorted(counts.items())),
                      "state": state})
    return waves


_ROLLED_BACK = ("rollback-sent", "rolled-back")  # only on the controller's command: a device undoing a failure is failed


def rolled_back_by(summary: dict[str, Any]) -> str | None:
    """Who had the devices rolled back: ``operator`` (an abort) or ``halt`` (a failing gate); None while neither."""
    status = summary["status"]
    return "operator" if status in ("aborting", "aborted") else "halt" if status in ("rolling-back", "rolled-back") else None


class _ReadOnly:
    """A publisher for measuring gates: measuring never reaches a device."""

    def desired(self, device_id: str, message: SetMessage) -> bytes:
        raise RuntimeError("gate measurement must not publish")

    def rollback(self, rollout: RolloutRow, device_id: str, message: SetMessage) -> tuple[bool, bytes]:
        raise RuntimeError("gate measurement must not publish")

    def send(self, device_id: str, leaf: str, payload: bytes) -> bool:
        raise RuntimeError("gate measurement must not publish")

    def expect(self, rollout: RolloutRow, rows: list[RolloutDevice]) -> None:
        raise RuntimeError("gate measurement must not publish")


def rollout_gates(store: Store, rollout: RolloutRow) -> list[dict[str, Any]]:
    """The gates over the rollout's current wave, measured now as the engine measures them (changing nothing)."""
    from edgectl.controller.engine import Engine  # the engine's facts, not a second reading of them
    from edgectl.controller.service import backend_fallback

    stopped = _stopped(rollout)
    if stopped:  # gates judge a wave that runs; after a halt or an abort the rolled-back devices are no failures to count
        return [{"wave": rollout.wave, "gate": g.text, "metric": g.metric, "op": g.op, "threshold": g.threshold,
                 "unit": g.unit, "value": None, "holds": False, "verdict": "not judged", "detail": stopped}
                for g in parse_gates(rollout.spec.gates)]
    rows = [r for r in store.rollout_devices(rollout.id) if r.wave == rollout.wave]
    results = Engine(store, _ReadOnly(), backend_fallback).gate_values(rollout, rows)
    return [{"wave": rollout.wave, "gate": g.text, "metric": g.metric, "op": g.op, "threshold": g.threshold, "unit": g.unit,
             "value": r.value if r.value is None or math.isfinite(r.value) else None, "holds": r.holds,
             "verdict": r.verdict.value, "detail": r.detail}
            for g, r in zip(parse_gates(rollout.spec.gates), results, strict=True)]


def _stopped(rollout: RolloutRow) -> str:
    """Why the gates are no longer judged ("" while they are)."""
    if rollout.status.value in ("aborting", "aborted"):
        return "not judged: the operator aborted the rollout"
    if rollout.status.value in ("rolling-back", "rolled-back"):
        return f"not judged since the halt ({rollout.reason})"
    return ""


def waiting_for_data(rollout: RolloutRow, gates: list[dict[str, Any]]) -> dict[str, Any] | None:
    """While a baked wave waits for a gate's data: since when, until when (then it halts) and which gates."""
    if rollout.phase is not Phase.WAITING or rollout.status.value in {s.value for s in FINAL}:
        return None
    from edgectl.controller.engine import Engine

    return {"wave": rollout.wave, "since": rollout.phase_since, "deadline": Engine.data_deadline(rollout),
            "gates": [g["gate"] for g in gates if g["verdict"] == Verdict.NO_DATA.value]}


def rollout_status(store: Store, rollout_id: str) -> dict[str, Any]:
    """:func:`rollout_summary` plus ``progress`` (per wave) and ``gate_values`` (each gate against its threshold)."""
    summary = rollout_summary(store, rollout_id)
    rollout = store.rollout(rollout_id)
    assert rollout is not None  # rollout_summary raised NotFoundError otherwise
    gates = rollout_gates(store, rollout)
    return {**summary, "progress": rollout_waves(summary), "gate_values": gates,
            "waiting_for_data": waiting_for_data(rollout, gates)}
