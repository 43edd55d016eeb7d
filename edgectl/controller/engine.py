"""Drives rollouts from the store: starts waves, applies device reports, checks gates, halts.

Every decision reads the store and writes it back before acting on the broker, so a controller
killed at any point resumes where it stopped; the signed desired state of each device is kept
and republished verbatim (same sequence number) after a broker restart, which agents that
already took it ignore.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any, Callable, Optional

from agent.protocol.messages import DeviceEvent
from edgectl.controller.gates import DeviceFacts, GateResult, parse_gate
from edgectl.controller.store import RolloutDevice, RolloutRow, SqliteStore

__all__ = ["ACTIVE", "Engine", "Publisher"]

log = logging.getLogger(__name__)

ACTIVE = ("running", "paused", "rolling-back")
IN_FLIGHT = ("sent", "running")
COUNTED_FAILED = ("failed", "rolled-back")


class Publisher:
    """How the engine reaches devices; the service implements it over MQTT."""

    def desired(self, rollout: RolloutRow, row: RolloutDevice, cancel: bool = False) -> Optional[bytes]: ...
    def send(self, device_id: str, leaf: str, payload: bytes) -> bool: ...
    def rollback(self, rollout: RolloutRow, device_id: str) -> None: ...


class Engine:
    def __init__(self, store: SqliteStore, publisher: Publisher, fallback_of: Callable[[Optional[str], str], Optional[bool]],
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.publisher = publisher
        self.fallback_of = fallback_of
        self.clock = clock

    # -- reports from devices -------------------------------------------------------------------

    def on_event(self, event: DeviceEvent) -> None:
        for rollout, row in self._rows_for(event.device_id, event.deployment_id, event.status):
            self._apply(rollout, row, event.status, event.state, event.detail, event.data)

    def on_state(self, device_id: str, state: dict[str, Any]) -> None:
        """Catch up on reports missed while the controller was down: the retained state tells."""
        active = state.get("active") or {}
        if state.get("deployment") is not None:
            return
        for rollout, row in self._rows_for(device_id, None, ""):
            if row.status in IN_FLIGHT + ("deferred",) and active.get("artifact_id") == row.variant:
                self._apply(rollout, row, "ok", "done", "committed (from the device's state)", {"backend": active.get("backend")})
            elif row.status == "rollback-sent" and active.get("artifact_id") != row.variant:
                self._apply(rollout, row, "rolled-back", "rollback", "rolled back (from the device's state)", {})

    def _rows_for(self, device_id: str, deployment_id: Optional[str], status: str) -> list[tuple[RolloutRow, RolloutDevice]]:
        found = []
        for rollout in self.store.rollouts():
            if deployment_id not in (None, rollout.id) and not (status == "rejected" and deployment_id == "none"):
                continue
            if rollout.status == "aborted":
                continue
            for row in self.store.rollout_devices(rollout.id):
                if row.device_id == device_id and row.status not in ("skipped", "planned", "cancelled"):
                    found.append((rollout, row))
        return found

    def _apply(self, rollout: RolloutRow, row: RolloutDevice, status: str, state: str, detail: str, data: dict[str, Any]) -> None:
        before = row.status
        row.state, row.detail = state, detail
        row.data.update({k: v for k, v in data.items() if v is not None})
        if status == "ok":
            row.status = "ok"
            row.installed_at = row.installed_at or self.clock()
            p95 = data.get("health_p95_ms")
            if p95 is not None and data.get("model"):
                self.store.add_latency(row.device_id, str(data["model"]), int(data.get("version", 0)), float(p95), "health", self.clock())
        elif status == "rolled-back":
            row.status = "rolled-back" if before == "rollback-sent" else "failed"
        elif status in ("failed", "rejected"):
            row.status = "failed"
        elif status == "running" and before in ("sent", "deferred"):
            row.status = "running"
        self.store.save_rollout_device(row)
        if row.status != before:
            self.store.audit(f"device {row.status}", f"{state}: {detail}", rollout.id, row.device_id)
        if row.status == "ok" and rollout.status in ("rolling-back",):
            self._roll_back_device(rollout, row)

    # -- operator requests ------------------------------------------------------------------------

    def request(self, rollout_id: str, action: str) -> None:
        rollout = self.store.rollout(rollout_id)
        if rollout is None:
            return
        if action == "pause" and rollout.status == "running":
            rollout.status = "paused"
        elif action == "resume" and rollout.status == "paused":
            rollout.status = "running"
        elif action == "abort" and rollout.status in ACTIVE + ("done",):
            rollout.status, rollout.reason = "aborted", "aborted by operator"
            self._cancel_pending(rollout)
        elif action == "retry-failed" and rollout.status in ("running", "paused", "done"):
            self._retry_failed(rollout)
        else:
            self.store.audit(f"{action} ignored", f"rollout is {rollout.status}", rollout.id, actor="operator")
            return
        self.store.save_rollout(rollout)
        self.store.audit(action, rollout.status, rollout.id, actor="operator")

    def _retry_failed(self, rollout: RolloutRow) -> None:
        for row in self.store.rollout_devices(rollout.id):
            if row.status == "failed" and row.wave <= rollout.wave:
                row.desired = self.publisher.desired(rollout, row)
                row.status, row.detail = "sent", "retry"
                self.store.save_rollout_device(row)
                self.store.audit("device retry", "", rollout.id, row.device_id)
        if rollout.status == "done":
            rollout.status = "running"

    # -- the tick ---------------------------------------------------------------------------------

    def tick(self) -> None:
        for rollout in self.store.rollouts(ACTIVE):
            if rollout.status == "running":
                self._advance(rollout)
            elif rollout.status == "rolling-back":
                self._finish_rollback(rollout)

    def _advance(self, rollout: RolloutRow) -> None:
        rows = [r for r in self.store.rollout_devices(rollout.id) if r.wave == rollout.wave]
        if rollout.phase == "start":
            self._start_wave(rollout, rows)
        elif rollout.phase == "installing":
            self._installing(rollout, rows)
        elif rollout.phase == "baking":
            self._baking(rollout, rows)

    def _start_wave(self, rollout: RolloutRow, rows: list[RolloutDevice]) -> None:
        for row in rows:
            if row.status != "planned":
                continue
            device = self.store.device(row.device_id)
            active = ((device.state if device else {}) or {}).get("active") or {}
            row.previous = {"name": active.get("name"), "version": active.get("version"), "artifact_id": active.get("artifact_id")}
            row.desired = self.publisher.desired(rollout, row)
            row.status = "sent" if device is not None and device.online else "deferred"
            self.store.save_rollout_device(row)
            self.store.audit(f"device {row.status}", "desired state published", rollout.id, row.device_id)
        self._phase(rollout, "installing")
        self.store.audit("wave started", f"wave {rollout.wave}: {len(rows)} device(s)", rollout.id)

    def _installing(self, rollout: RolloutRow, rows: list[RolloutDevice]) -> None:
        spec, now = rollout.spec, self.clock()
        timed_out = now - rollout.phase_since > float(spec["wave_timeout_s"])
        for row in rows:
            if row.status in IN_FLIGHT and timed_out:
                row.status, row.detail = "failed", f"no final report within {spec['wave_timeout_s']:.0f}s"
                self.store.save_rollout_device(row)
                self.store.audit("device failed", row.detail, rollout.id, row.device_id)
        counted = [r for r in rows if r.status not in ("deferred",)]
        failed = sum(r.status in COUNTED_FAILED for r in counted)
        if counted and failed > math.floor(float(spec["max_failure"]) * len(counted)):
            return self._halt(rollout, f"wave {rollout.wave}: failure_rate {failed}/{len(counted)} exceeds {spec['max_failure'] * 100:.1f}%")
        if all(r.status not in IN_FLIGHT for r in rows):
            self._phase(rollout, "baking")
            self.store.audit("wave installed", f"wave {rollout.wave}: baking {spec['bake_s']:.0f}s", rollout.id)

    def _baking(self, rollout: RolloutRow, rows: list[RolloutDevice]) -> None:
        results = self.check_gates(rollout, rows)
        failing = [r for r in results if not r.holds]
        if failing:
            return self._halt(rollout, f"wave {rollout.wave}: gate {failing[0].gate!r} failed ({failing[0].detail})")
        if self.clock() - rollout.phase_since < float(rollout.spec["bake_s"]):
            return
        self.store.audit("wave promoted", "; ".join(f"{r.gate}: {r.detail}" for r in results), rollout.id)
        if rollout.wave >= int(rollout.spec["wave_count"]):
            rollout.status, rollout.reason = "done", "every wave promoted"
            self.store.save_rollout(rollout)
            self.store.audit("rollout done", "", rollout.id)
        else:
            rollout.wave += 1
            self._phase(rollout, "start")

    def check_gates(self, rollout: RolloutRow, rows: list[RolloutDevice]) -> list[GateResult]:
        facts = [self._facts(rollout, r) for r in rows]
        for fact, row in zip(facts, rows):
            if row.status == "ok" and fact.silent_s is not None and fact.silent_s > float(rollout.spec["silence_s"]):
                row.status, row.detail = "failed", f"silent for {fact.silent_s:.0f}s after install"
                self.store.save_rollout_device(row)
                self.store.audit("device failed", row.detail, rollout.id, row.device_id)
        return [parse_gate(text).check(facts) for text in rollout.spec["gates"]]

    def _facts(self, rollout: RolloutRow, row: RolloutDevice) -> DeviceFacts:
        fact = DeviceFacts(row.device_id, row.status, agreement=row.data.get("agreement"))
        if row.status != "ok":
            return fact
        device = self.store.device(row.device_id)
        package = next(p for p in rollout.spec["packages"] if p["artifact_id"] == row.variant)
        now = self.clock()
        if device is not None:
            heard = max(device.telemetry_ts or 0.0, row.installed_at or now)
            fact.silent_s = math.inf if device.online is False else max(0.0, now - heard)
            stats = (device.telemetry.get("models") or {}).get(package["name"]) or {}
            if str(stats.get("version")) == str(package["version"]):
                fact.requests, fact.errors = int(stats.get("requests", 0)), int(stats.get("errors", 0))
            fact.fallback = self.fallback_of((device.birth or {}).get("target"), str(row.data.get("backend") or ""))
        fact.p95_ms, fact.latency_ratio = self._latency(row, package)
        return fact

    def _latency(self, row: RolloutDevice, package: dict[str, Any]) -> tuple[Optional[float], Optional[float]]:
        """(new p95, new / previous p95), comparing like with like: telemetry, else health checks."""
        prev = row.previous
        new_p95 = None
        for source in ("telemetry", "health"):
            new = [x for x in self.store.latency(row.device_id, package["name"], int(package["version"]), since=(row.installed_at or 0) - 1) if x["source"] == source]
            if not new:
                continue
            new_p95 = new_p95 if new_p95 is not None else new[-1]["p95_ms"]
            if not prev.get("name") or prev.get("version") is None:
                continue
            old = [x for x in self.store.latency(row.device_id, prev["name"], int(prev["version"]), limit=50) if x["source"] == source]
            if old and old[-1]["p95_ms"] > 0:
                return new[-1]["p95_ms"], new[-1]["p95_ms"] / old[-1]["p95_ms"]
        return new_p95, None

    # -- halting ----------------------------------------------------------------------------------

    def _halt(self, rollout: RolloutRow, reason: str) -> None:
        rollout.status, rollout.reason = "rolling-back", reason
        self.store.save_rollout(rollout)
        self.store.audit("rollout halted", reason, rollout.id)
        log.warning("rollout %s halted: %s", rollout.id, reason)
        self._cancel_pending(rollout)
        for row in self.store.rollout_devices(rollout.id):
            if row.status == "ok":
                self._roll_back_device(rollout, row)

    def _roll_back_device(self, rollout: RolloutRow, row: RolloutDevice) -> None:
        self.publisher.rollback(rollout, row.device_id)
        row.status = "rollback-sent"
        self.store.save_rollout_device(row)
        self.store.audit("device rollback-sent", "", rollout.id, row.device_id)

    def _cancel_pending(self, rollout: RolloutRow) -> None:
        for row in self.store.rollout_devices(rollout.id):
            if row.status in ("planned", "deferred"):
                if row.status == "deferred":  # replace the retained desired state it has not taken
                    self.publisher.desired(rollout, row, cancel=True)
                row.status = "cancelled"
                self.store.save_rollout_device(row)
                self.store.audit("device cancelled", "", rollout.id, row.device_id)

    def _finish_rollback(self, rollout: RolloutRow) -> None:
        rows = self.store.rollout_devices(rollout.id)
        waiting = [r for r in rows if r.status in ("rollback-sent",) + IN_FLIGHT]
        if waiting and self.clock() - rollout.updated < float(rollout.spec["wave_timeout_s"]):
            return
        rollout.status = "rolled-back"
        self.store.save_rollout(rollout)
        self.store.audit("rollout rolled-back", f"{len(waiting)} device(s) did not confirm", rollout.id)

    def _phase(self, rollout: RolloutRow, phase: str) -> None:
        rollout.phase, rollout.phase_since = phase, self.clock()
        self.store.save_rollout(rollout)
