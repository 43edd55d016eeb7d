"""Drives rollouts from the store: starts waves, checks gates, promotes, halts, applies operator requests.

Every decision reads the store and writes it back before acting on the broker, so a controller
killed at any point resumes where it stopped; the signed desired state of each device is kept
and republished verbatim (same sequence number) after a broker restart, which agents that
already took it ignore. Device reports are applied by :class:`edgectl.controller.reports.Reports`.

Rollout statuses change only through the table in :mod:`edgectl.controller.lifecycle`
(:meth:`Engine._transition`): operator requests and the engine's verdicts (halt, complete,
settled) are its events.

Halting and aborting do the same to devices: those not sent yet are cancelled (an offline device's
retained desired state is replaced by an empty one, so it does not catch up later), and those that
took the new model get a signed ``rollback`` command; no device is left half-way.

Phases of a wave: ``start`` -> ``installing`` -> ``baking`` -> next wave. A phase is one entry of
``Engine.phases``. With ``--shadow`` the first wave's devices are asked for a shadow run before they
cut over (the device compares the new model with the serving one and refuses below the agreement
gate's threshold); their reported agreement is checked while the wave installs.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

from edgectl.controller.gates import DeviceFacts, GateResult, parse_gates
from edgectl.controller.lifecycle import RolloutEvent, advance, applies_to
from edgectl.controller.pacing import SENT_AT, Pacer
from edgectl.controller.records import (
    ACTIVE,
    COUNTED_FAILED,
    IN_FLIGHT,
    DeviceStatus,
    ModelRef,
    PackageRef,
    Phase,
    RolloutDevice,
    RolloutRow,
    RolloutStatus,
)
from edgectl.controller.reports import Publisher, Reports
from edgectl.controller.store import Store

__all__ = ["Engine"]

log = logging.getLogger(__name__)

D, S, E = DeviceStatus, RolloutStatus, RolloutEvent
WITHDRAWN = "withdrawn"  # key in a row's data: a stopped rollout replaced its in-flight desired state


class Engine(Reports):
    def __init__(self, store: Store, publisher: Publisher, fallback_of: Callable[[str | None, str], bool | None],
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__(store, publisher, clock)
        self.fallback_of = fallback_of
        self.pacer = Pacer()
        self.phases: dict[Phase, Callable[[RolloutRow, list[RolloutDevice]], None]] = {
            Phase.START: self._start_wave, Phase.INSTALLING: self._installing, Phase.BAKING: self._baking,
        }

    def _transition(self, rollout: RolloutRow, event: RolloutEvent, reason: str | None = None) -> RolloutStatus:
        """Move the rollout's status along the lifecycle table (refusing an edge it lacks) and save it."""
        before = rollout.status
        rollout.status = advance(before, event)
        if reason is not None:
            rollout.reason = reason
        self.store.save_rollout(rollout)
        log.info("rollout %s: %s --%s--> %s", rollout.id, before.value, event.value, rollout.status.value)
        return before

    # -- operator requests ------------------------------------------------------------------------

    def request(self, rollout_id: str, action: str) -> None:
        rollout = self.store.rollout(rollout_id)
        if rollout is None:
            return
        try:
            event = RolloutEvent(action)
        except ValueError:
            self.store.audit(f"{action} ignored", "unknown request", rollout.id, actor="operator")
            return
        if event not in (E.PAUSE, E.RESUME, E.ABORT, E.RETRY_FAILED) or not applies_to(event, rollout.status):
            self.store.audit(f"{action} ignored", f"rollout is {rollout.status}", rollout.id, actor="operator")
            return
        self.store.audit(action, f"was {rollout.status}", rollout.id, actor="operator")
        if event is E.ABORT:
            self._stop(rollout, E.ABORT, "aborted by operator")
        elif event is E.RETRY_FAILED:
            self._retry_failed(rollout)
        else:
            self._transition(rollout, event)

    def _retry_failed(self, rollout: RolloutRow) -> None:
        """Send the update again to failed devices of started waves; they join the current wave."""
        rows = [r for r in self.store.rollout_devices(rollout.id) if r.status == D.FAILED and r.wave <= rollout.wave]
        for row in rows:
            row.wave, row.installed_at = rollout.wave, None
            self._send(rollout, row, "retry")
        if rows and rollout.phase != Phase.START:
            self._phase(rollout, Phase.INSTALLING)
        reason = f"retrying {len(rows)} failed device(s)" if rollout.status == S.DONE else None
        self._transition(rollout, E.RETRY_FAILED, reason)

    # -- the tick ---------------------------------------------------------------------------------

    def tick(self) -> None:
        for rollout in self.store.rollouts(ACTIVE):
            if rollout.status in (S.RUNNING, S.PAUSED):
                rows = [r for r in self.store.rollout_devices(rollout.id) if r.wave == rollout.wave]
                self.phases[rollout.phase](rollout, rows)
            else:
                self._finish_stop(rollout)

    def _start_wave(self, rollout: RolloutRow, rows: list[RolloutDevice]) -> None:
        if rollout.status != S.RUNNING:
            return
        self._send_planned(rollout, rows)
        self._phase(rollout, Phase.INSTALLING)
        self.store.audit("wave started", f"wave {rollout.wave}: {len(rows)} device(s)", rollout.id)

    def _send_planned(self, rollout: RolloutRow, rows: list[RolloutDevice]) -> None:
        """Send the wave's planned devices: all at once, or as many as ``--max-per-minute`` allows now."""
        due = self.pacer.due(rollout, rows, self.clock())
        if not due:
            return
        online = {d.id for d in self.store.devices() if d.online}
        self.publisher.expect(rollout, [r for r in due if r.device_id in online])
        for row in due:
            self._supersede(rollout, row.device_id)
            device = self.store.device(row.device_id)
            row.previous = ModelRef.from_dict(((device.state if device else {}) or {}).get("active") or {})
            if rollout.spec.max_per_minute:
                row.data[SENT_AT] = self.clock()
            self._send(rollout, row, "desired state published")

    def _send(self, rollout: RolloutRow, row: RolloutDevice, why: str) -> None:
        """Publish the device's desired state; an offline device is deferred: it takes it when it returns."""
        device = self.store.device(row.device_id)
        row.desired = self.publisher.desired(rollout, row)
        row.status = D.SENT if device is not None and device.online else D.DEFERRED
        row.detail = why
        self.store.save_rollout_device(row)
        self.store.audit(f"device {row.status}", why, rollout.id, row.device_id)

    def _supersede(self, rollout: RolloutRow, device_id: str) -> None:
        """A newer desired state replaces what an older rollout sent and the device has not finished."""
        for row in self.store.device_rollouts(device_id):
            if row.rollout_id != rollout.id and row.status in (*IN_FLIGHT, D.DEFERRED):
                row.status, row.detail = D.SUPERSEDED, f"by rollout {rollout.id}"
                self.store.save_rollout_device(row)
                self.store.audit("device superseded", row.detail, row.rollout_id, device_id)

    def _installing(self, rollout: RolloutRow, rows: list[RolloutDevice]) -> None:
        spec, now = rollout.spec, self.clock()
        if rollout.status == S.RUNNING and any(r.status == D.PLANNED for r in rows):
            self._send_planned(rollout, rows)  # a paced wave sends the rest as the rate allows
        if now - rollout.phase_since > spec.wave_timeout_s + self.pacer.stretch_s(rollout, rows):
            for row in rows:
                if row.status in IN_FLIGHT:
                    self._set(rollout, row, D.FAILED, f"no final report within {spec.wave_timeout_s:.0f}s")
        disagreement = self._shadow_verdict(rollout, rows)
        if disagreement:
            return self._stop(rollout, E.HALT, disagreement)
        counted = [r for r in rows if r.status not in (D.DEFERRED, D.PLANNED)]
        failed = sum(r.status in COUNTED_FAILED for r in counted)
        if counted and failed > math.floor(spec.max_failure * len(counted)):
            return self._stop(rollout, E.HALT,
                              f"wave {rollout.wave}: failure_rate {failed}/{len(counted)} exceeds {spec.max_failure * 100:.1f}%")
        if all(r.status not in (*IN_FLIGHT, D.PLANNED) for r in rows):
            self._phase(rollout, Phase.BAKING)
            self.store.audit("wave installed", f"wave {rollout.wave}: baking {spec.bake_s:.0f}s", rollout.id)

    def _baking(self, rollout: RolloutRow, rows: list[RolloutDevice]) -> None:
        results = self.check_gates(rollout, rows)
        failing = [r for r in results if not r.holds]
        if failing:
            return self._stop(rollout, E.HALT, f"wave {rollout.wave}: gate {failing[0].gate!r} failed ({failing[0].detail})")
        if rollout.status != S.RUNNING or self.clock() - rollout.phase_since < rollout.spec.bake_s:
            return
        self.store.audit("wave promoted", "; ".join(f"{r.gate}: {r.detail}" for r in results), rollout.id)
        if rollout.wave >= rollout.spec.wave_count:
            self._transition(rollout, E.COMPLETE, "every wave promoted")
            self.store.audit("rollout done", "", rollout.id)
        else:
            rollout.wave += 1
            self._phase(rollout, Phase.START)

    # -- gates ------------------------------------------------------------------------------------

    def check_gates(self, rollout: RolloutRow, rows: list[RolloutDevice]) -> list[GateResult]:
        facts = [self._facts(rollout, r) for r in rows]
        for fact, row in zip(facts, rows, strict=True):
            if row.status == D.OK and fact.silent_s is not None and fact.silent_s > rollout.spec.silence_s:
                self._set(rollout, row, D.FAILED, f"silent for {fact.silent_s:.0f}s after install")
        return [gate.check(facts) for gate in parse_gates(rollout.spec.gates)]

    def gate_values(self, rollout: RolloutRow, rows: list[RolloutDevice]) -> list[GateResult]:
        """The gates measured now over ``rows``, as :meth:`check_gates` does, changing nothing (for status views)."""
        facts = [self._facts(rollout, r) for r in rows]
        return [gate.check(facts) for gate in parse_gates(rollout.spec.gates)]

    def _shadow_verdict(self, rollout: RolloutRow, rows: list[RolloutDevice]) -> str | None:
        """Canaries report their shadow run before cut-over: a failing agreement gate halts the wave at once."""
        if not rollout.spec.shadow:
            return None
        facts = [DeviceFacts(r.device_id, r.status, agreement=r.shadow_agreement) for r in rows]
        for gate in parse_gates(rollout.spec.gates):
            result = gate.check(facts) if gate.metric == "agreement" else None
            if result is not None and not result.holds:
                return f"wave {rollout.wave}: gate {result.gate!r} failed ({result.detail}, shadow run before cut-over)"
        return None

    def _facts(self, rollout: RolloutRow, row: RolloutDevice) -> DeviceFacts:
        fact = DeviceFacts(row.device_id, row.status, agreement=row.shadow_agreement)
        if row.status != D.OK:
            return fact
        device = self.store.device(row.device_id)
        package = rollout.spec.package(row.variant)
        now = self.clock()
        if device is not None:
            # Offline or not, what counts is how long nothing was heard since the install.
            heard = max(device.telemetry_ts or 0.0, device.last_seen or 0.0, row.installed_at or now)
            fact.silent_s = max(0.0, now - heard)
            stats = (device.telemetry.get("models") or {}).get(package.name) or {}
            if str(stats.get("version")) == str(package.version):
                fact.requests, fact.errors = int(stats.get("requests", 0)), int(stats.get("errors", 0))
            fact.fallback = self.fallback_of((device.birth or {}).get("target"), str(row.data.get("backend") or ""))
        fact.p95_ms, fact.latency_ratio = self._latency(row, package)
        return fact

    def _latency(self, row: RolloutDevice, package: PackageRef) -> tuple[float | None, float | None]:
        """(new p95, new / previous p95), comparing like with like: telemetry, else health checks."""
        prev = row.previous
        new_p95 = None
        for source in ("telemetry", "health"):
            new = [x for x in self.store.latency(row.device_id, package.name, package.version, since=(row.installed_at or 0) - 1)
                   if x.source == source]
            if not new:
                continue
            new_p95 = new_p95 if new_p95 is not None else new[-1].p95_ms
            if not prev.name or prev.version is None:
                continue
            old = [x for x in self.store.latency(row.device_id, prev.name, prev.version, limit=50) if x.source == source]
            if old and old[-1].p95_ms > 0:
                return new[-1].p95_ms, new[-1].p95_ms / old[-1].p95_ms
        return new_p95, None

    # -- halting and aborting ---------------------------------------------------------------------

    def _stop(self, rollout: RolloutRow, event: RolloutEvent, reason: str) -> None:
        """Halt (a gate failed) or abort: cancel what was not taken, roll back what was."""
        self._transition(rollout, event, reason)
        self._phase(rollout, Phase.ROLLBACK)
        self.store.audit("rollout halted" if event is E.HALT else "rollout aborting", reason, rollout.id)
        log.warning("rollout %s %s: %s", rollout.id, rollout.status, reason)
        self._wind_down(rollout, self.store.rollout_devices(rollout.id))

    def _wind_down(self, rollout: RolloutRow, rows: list[RolloutDevice]) -> None:
        """Cancel what was not taken, roll back what was, each row once.

        Run again on every tick of a stopped rollout: a leader killed half-way through (the status
        saved, some rows not handled yet) leaves the rest to whichever controller leads next."""
        for row in rows:
            if row.status == D.PLANNED:
                self._set(rollout, row, D.CANCELLED, "never sent")
            elif row.status == D.DEFERRED:  # replace the retained desired state it has not taken
                row.desired = self.publisher.desired(rollout, row, cancel=True)
                self._set(rollout, row, D.CANCELLED, "offline: its desired state was withdrawn")
            elif row.status in IN_FLIGHT and not row.data.get(WITHDRAWN):
                # Not taken yet: withdraw the retained desired state; if it still commits, it is rolled back then.
                row.desired = self.publisher.desired(rollout, row, cancel=True)
                row.data[WITHDRAWN] = True
                self.store.save_rollout_device(row)
            elif self.took(row):
                self.roll_back(rollout, row)

    def _set(self, rollout: RolloutRow, row: RolloutDevice, status: DeviceStatus, detail: str) -> None:
        row.status, row.detail = status, detail
        self.store.save_rollout_device(row)
        self.store.audit(f"device {status}", detail, rollout.id, row.device_id)

    def _finish_stop(self, rollout: RolloutRow) -> None:
        """Wait for rollbacks and in-flight installs to report, up to the wave timeout."""
        rows = self.store.rollout_devices(rollout.id)
        self._wind_down(rollout, rows)  # rows are updated in place
        waiting = [r for r in rows if r.status in (D.ROLLBACK_SENT, *IN_FLIGHT)]
        if waiting and self.clock() - rollout.phase_since < rollout.spec.wave_timeout_s:
            return
        self._transition(rollout, E.SETTLED)
        names = ", ".join(r.device_id for r in waiting[:10])
        detail = f"{len(waiting)} device(s) did not confirm: {names}" if waiting else "every device confirmed"
        self.store.audit(f"rollout {rollout.status}", detail, rollout.id)

    def _phase(self, rollout: RolloutRow, phase: Phase) -> None:
        rollout.phase, rollout.phase_since = phase, self.clock()
        self.store.save_rollout(rollout)
