"""Drives rollouts from the store: starts waves, checks gates, promotes, halts, applies operator requests.

Every decision reads the store and writes it back before acting on the broker, so a controller
killed at any point resumes where it stopped; the signed desired state of each device is kept
and republished verbatim (same sequence number) after a broker restart, which agents that
already took it ignore. Device reports are applied by :class:`edgectl.controller.reports.Reports`, the
engine's collaborator (``Engine.reports``), which also sends the rollbacks a halt asks for.

Rollout statuses change only through the table in :mod:`edgectl.controller.lifecycle`
(:meth:`Engine._transition`): operator requests and the engine's verdicts (start, halt, complete,
settled) are its events. A ``scheduled`` rollout starts on the first tick at or after its start
time by this engine's clock (the store's, :mod:`edgectl.controller.clock`), so replicas agree on
when; one awaiting approval is left alone until a second operator decides (edgectl.fleet.approvals).

Halting and aborting do the same to devices: those not sent yet are cancelled (an offline device's
retained desired state is replaced by an empty one, so it does not catch up later), and those that
took the new model get a signed ``rollback`` command; no device is left half-way.

Phases of a wave: ``start`` -> ``installing`` -> ``baking`` -> next wave, with ``waiting`` between the
bake and the next wave while a gate has no data (nothing passes on no data): the wave waits for data
until ``wave_timeout_s`` after its bake and then halts, unless the rollout allows promotion without data
(``--allow-no-data``). A phase is one entry of ``Engine.phases``. With ``--shadow`` the first wave's
devices are asked for a shadow run before they cut over (the device compares the new model with the
serving one and refuses below the agreement gate's threshold); their reported agreement is checked
while the wave installs. A device whose group has maintenance windows is sent only inside one, in its
local time (edgectl.controller.maintenance), so its wave installs until the last window opened;
each device's wave timeout counts from its own send, or from when it said its window opens.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from edgectl.controller.baselines import Baselines
from edgectl.controller.composition import PREVIOUS, WITHDRAWN, Composer, previous_json, revert_message, shadow_threshold
from edgectl.controller.gates import DeviceFacts, Gate, GateResult, blocking, first_failing, parse_gates
from edgectl.controller.lifecycle import RolloutEvent, advance, applies_to
from edgectl.controller.maintenance import OPENS_AT, hold_reason
from edgectl.controller.pacing import SENT_AT, Pacer
from edgectl.controller.records import (
    ACTIVE,
    IN_FLIGHT,
    DeviceStatus,
    ModelRef,
    Phase,
    RolloutDevice,
    RolloutRow,
    RolloutStatus,
)
from edgectl.controller.reports import Publisher, Reports
from edgectl.controller.schedule import iso_utc
from edgectl.controller.screen import Screen
from edgectl.controller.store import Store

__all__ = ["Engine"]

log = logging.getLogger(__name__)

D, S, E = DeviceStatus, RolloutStatus, RolloutEvent


class Engine:
    def __init__(self, store: Store, publisher: Publisher, fallback_of: Callable[[str | None, str], bool | None],
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.publisher = publisher
        self.clock = clock
        self.sets = Composer(store)
        self.screen = Screen(store, self.sets)
        self.reports = Reports(store, publisher, clock, self.sets)
        self.fallback_of = fallback_of
        self.pacer = Pacer()
        self.baselines = Baselines(store)
        self.gone: set[str] = set()  # decommissioned devices, read at each tick: no rollout sends them anything again
        self.phases: dict[Phase, Callable[[RolloutRow, list[RolloutDevice]], None]] = {
            Phase.START: self._start_wave, Phase.INSTALLING: self._installing, Phase.BAKING: self._baking,
            Phase.WAITING: self._waiting,
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
        rows = [r for r in self.store.rollout_devices(rollout.id)
                if r.status == D.FAILED and r.wave <= rollout.wave and r.device_id not in self.gone]
        for row in rows:
            row.wave, row.installed_at = rollout.wave, None
            self._send(rollout, row, "retry")
        if rows and rollout.phase != Phase.START:
            self._phase(rollout, Phase.INSTALLING)
        reason = f"retrying {len(rows)} failed device(s)" if rollout.status == S.DONE else None
        self._transition(rollout, E.RETRY_FAILED, reason)

    # -- the tick ---------------------------------------------------------------------------------

    def tick(self) -> None:
        self.sets.refresh()  # rollouts recorded since keep packages a set may name
        self.screen.refresh()
        self.gone = self.store.decommissioned_ids()
        self._start_due()
        for rollout in self.store.rollouts(ACTIVE):
            rows = self._members(rollout, self.store.rollout_devices(rollout.id))
            if rollout.status in (S.RUNNING, S.PAUSED):
                self.phases[rollout.phase](rollout, [r for r in rows if r.wave == rollout.wave])
            else:
                self._finish_stop(rollout, rows)

    def _start_due(self) -> None:
        """Start the scheduled rollouts whose start time came (those without one at once); the first wave starts now."""
        now = self.clock()
        for rollout in self.store.rollouts((S.SCHEDULED,)):
            start_at = rollout.spec.start_at
            if start_at is not None and start_at > now:
                continue
            rollout.phase, rollout.phase_since = Phase.START, now
            with self.store.batch():
                self._transition(rollout, E.START, "")
                when = "approved, no start time" if start_at is None else f"start time {iso_utc(start_at)} reached"
                self.store.audit("rollout started", when, rollout.id)

    def _members(self, rollout: RolloutRow, rows: list[RolloutDevice]) -> list[RolloutDevice]:
        """The rows of fleet members. A decommissioned device's part that was not finished is cancelled (nothing is sent
        to it again, nothing waits for it); its rows count in no gate, wave or rollback."""
        for row in rows:
            if row.device_id in self.gone and row.status in (D.PLANNED, D.DEFERRED, *IN_FLIGHT, D.ROLLBACK_SENT):
                self._set(rollout, row, D.CANCELLED, "device decommissioned")
        return [r for r in rows if r.device_id not in self.gone]

    def _start_wave(self, rollout: RolloutRow, rows: list[RolloutDevice]) -> None:
        if rollout.status != S.RUNNING:
            return
        self._send_planned(rollout, rows)
        self._phase(rollout, Phase.INSTALLING)
        self.store.audit("wave started", f"wave {rollout.wave}: {len(rows)} device(s)", rollout.id)

    def _send_planned(self, rollout: RolloutRow, rows: list[RolloutDevice]) -> None:
        """Send the wave's planned devices whose maintenance windows are open (controller.maintenance): all at once,
        or as many as ``--max-per-minute`` allows now. A device held by its window says so in its row."""
        now = self.clock()
        open_rows = [r for r in rows if r.status != D.PLANNED or not self._held(rollout, r, now)]
        due = self.pacer.due(rollout, open_rows, now)
        if not due:
            return
        online = {d.id for d in self.store.devices() if d.online}
        self.publisher.expect(rollout, [r for r in due if r.device_id in online])
        for row in due:
            device = self.store.device(row.device_id)
            row.previous = ModelRef.named(device.state if device else None, rollout.spec.model)
            row.data[SENT_AT] = now  # its wave timeout counts from here when that is later than the wave's start
            self._send(rollout, row, "desired state published")

    def _held(self, rollout: RolloutRow, row: RolloutDevice, now: float) -> bool:
        """Whether the row's maintenance window keeps it from being sent now (its detail then says until when)."""
        reason = hold_reason(rollout.spec, row, now)
        if reason is not None and reason != row.detail:
            row.detail = reason
            self.store.save_rollout_device(row)
        return reason is not None

    def _send(self, rollout: RolloutRow, row: RolloutDevice, why: str) -> None:
        """Publish the device's set with this rollout's package in it; an offline device is deferred: it takes it
        when it returns. A set the device's agent or memory cannot take is refused here, and nothing is sent."""
        device = self.store.device(row.device_id)
        wanted, before = self.sets.for_send(rollout.spec, row, device)
        verdict = self.screen.verdict(rollout.id, device, wanted)
        if verdict.message is None:
            self._set(rollout, row, D.REFUSED, verdict.refusal)
            return
        self._supersede(rollout, row.device_id)
        row.data.setdefault(PREVIOUS, previous_json(before))  # what a rollback of this row puts back
        row.desired = self.publisher.desired(row.device_id, verdict.message)
        row.status = D.SENT if device is not None and device.online else D.DEFERRED
        row.detail = why
        self.store.save_rollout_device(row)
        self.store.audit(f"device {row.status}", why, rollout.id, row.device_id)

    def _supersede(self, rollout: RolloutRow, device_id: str) -> None:
        """A newer desired state of a model replaces what an older rollout of that model sent and the device has not
        finished; rollouts of other models on the device go on (the set sent holds their entries too)."""
        for row in self.store.device_rollouts(device_id):
            if row.rollout_id != rollout.id and row.status in (*IN_FLIGHT, D.DEFERRED) \
                    and self.sets.model_of(row.rollout_id) == rollout.spec.model:
                row.status, row.detail = D.SUPERSEDED, f"by rollout {rollout.id}"
                self.store.save_rollout_device(row)
                self.store.audit("device superseded", row.detail, row.rollout_id, device_id)

    def _installing(self, rollout: RolloutRow, rows: list[RolloutDevice]) -> None:
        spec, now = rollout.spec, self.clock()
        if rollout.status == S.RUNNING and any(r.status == D.PLANNED for r in rows):
            self._send_planned(rollout, rows)  # a paced wave sends the rest as the rate allows
        paced_start = rollout.phase_since + self.pacer.stretch_s(rollout, rows)
        for row in rows:  # from the wave's start (stretched by pacing), its own send or the window its device waits for
            started = max(paced_start, float(row.data.get(SENT_AT, 0.0)), float(row.data.get(OPENS_AT, 0.0)))
            if row.status in IN_FLIGHT and now - started > spec.wave_timeout_s:
                self._set(rollout, row, D.FAILED, f"no final report within {spec.wave_timeout_s:.0f}s")
        disagreement = self._shadow_verdict(rollout, rows)
        if disagreement:
            return self._stop(rollout, E.HALT, disagreement)
        # The failure budget is the failure_rate gate, judged here as the devices report and again while baking.
        budget = [g for g in parse_gates(spec.gates) if g.metric == "failure_rate"]
        over = first_failing(budget, [DeviceFacts(r.device_id, r.status) for r in rows])
        if over is not None:
            return self._stop(rollout, E.HALT, f"wave {rollout.wave}: gate {over.gate!r} failed ({over.detail})")
        if all(r.status not in (*IN_FLIGHT, D.PLANNED) for r in rows):
            self._phase(rollout, Phase.BAKING)
            self.store.audit("wave installed", f"wave {rollout.wave}: baking {spec.bake_s:.0f}s", rollout.id)

    def _baking(self, rollout: RolloutRow, rows: list[RolloutDevice]) -> None:
        results = self.check_gates(rollout, rows)
        failing = [r for r in results if r.fails]
        if failing:
            return self._stop(rollout, E.HALT, f"wave {rollout.wave}: gate {failing[0].gate!r} failed ({failing[0].detail})")
        if rollout.status != S.RUNNING or self.clock() - rollout.phase_since < rollout.spec.bake_s:
            return
        missing = blocking(results, rollout.spec.allow_no_data)
        if missing:
            self._phase(rollout, Phase.WAITING)
            self.store.audit("wave waiting for data", f"wave {rollout.wave}: " + "; ".join(
                f"{r.gate}: {r.detail}" for r in missing) + f"; halts in {rollout.spec.wave_timeout_s:.0f}s without it",
                rollout.id)
            return
        self._promote(rollout, results)

    def _waiting(self, rollout: RolloutRow, rows: list[RolloutDevice]) -> None:
        """The bake is over but a gate has no data: promote once it has, halt at the deadline."""
        results = self.check_gates(rollout, rows)
        missing = blocking(results, rollout.spec.allow_no_data)
        if any(r.fails for r in missing):
            failed = next(r for r in missing if r.fails)
            return self._stop(rollout, E.HALT, f"wave {rollout.wave}: gate {failed.gate!r} failed ({failed.detail})")
        if missing and self.clock() >= self.data_deadline(rollout):
            return self._stop(rollout, E.HALT, f"wave {rollout.wave}: gate {missing[0].gate!r} had no data "
                                               f"{rollout.spec.wave_timeout_s:.0f}s after the bake ({missing[0].detail})")
        if not missing and rollout.status == S.RUNNING:
            self._promote(rollout, results)

    @staticmethod
    def data_deadline(rollout: RolloutRow) -> float:
        """When a wave waiting for data halts (its phase began when the bake ended)."""
        return rollout.phase_since + rollout.spec.wave_timeout_s

    def _promote(self, rollout: RolloutRow, results: list[GateResult]) -> None:
        self.store.audit("wave promoted", "; ".join(f"{r.gate}: {r.detail}" for r in results), rollout.id)
        if rollout.wave >= rollout.spec.wave_count:
            with self.store.batch():  # one commit: a leader that dies here leaves no DONE rollout without its entry
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
        return [self._judge(rollout, gate, facts) for gate in parse_gates(rollout.spec.gates)]

    def gate_values(self, rollout: RolloutRow, rows: list[RolloutDevice]) -> list[GateResult]:
        """The gates measured now over ``rows``, as :meth:`check_gates` does, changing nothing (for status views)."""
        facts = [self._facts(rollout, r) for r in rows]
        return [self._judge(rollout, gate, facts) for gate in parse_gates(rollout.spec.gates)]

    @staticmethod
    def _judge(rollout: RolloutRow, gate: Gate, facts: list[DeviceFacts]) -> GateResult:
        """``gate`` over the wave's ``facts``, or not judged where it cannot apply to this wave: agreement where no device
        runs a shadow. A latency ratio on a first install has no earlier latency to compare with: that is no data (the
        wave waits, then halts, unless the rollout allows promotion without data), never a quiet pass."""
        if gate.metric == "agreement" and shadow_threshold(rollout.spec, rollout.wave) is None:
            return gate.not_judged("no device of this wave runs a shadow" + (
                " (only the first wave does)" if rollout.spec.shadow else " (the rollout was made without --shadow)"))
        return gate.check(facts)

    def _shadow_verdict(self, rollout: RolloutRow, rows: list[RolloutDevice]) -> str | None:
        """Canaries report their shadow run before cut-over: a failing agreement gate halts the wave at once."""
        if not rollout.spec.shadow:
            return None
        facts = [DeviceFacts(r.device_id, r.status, agreement=r.shadow_agreement) for r in rows]
        for gate in parse_gates(rollout.spec.gates):
            result = gate.check(facts) if gate.metric == "agreement" else None
            if result is not None and result.fails:  # canaries not reported yet: no data, the wave keeps installing
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
            stats = device.telemetry.models.get(package.name) if device.telemetry else None
            if stats is not None and stats.version == str(package.version):
                fact.requests, fact.errors = stats.requests or 0, stats.errors or 0
            fact.fallback = self.fallback_of(device.birth.target if device.birth else None, str(row.data.get("backend") or ""))
        latency = self.baselines.facts(rollout, row, package)
        fact.p95_ms, fact.latency_ratio, fact.latency_baseline_missing = latency.p95_ms, latency.ratio, latency.missing
        return fact

    # -- halting and aborting ---------------------------------------------------------------------

    def _stop(self, rollout: RolloutRow, event: RolloutEvent, reason: str) -> None:
        """Halt (a gate failed) or abort: cancel what was not taken, roll back what was."""
        self._transition(rollout, event, reason)
        self._phase(rollout, Phase.ROLLBACK)
        self.store.audit("rollout halted" if event is E.HALT else "rollout aborting", reason, rollout.id)
        log.warning("rollout %s %s: %s", rollout.id, rollout.status, reason)
        self.gone = self.store.decommissioned_ids()  # an operator's abort comes before the tick that reads them
        self._wind_down(rollout, self._members(rollout, self.store.rollout_devices(rollout.id)))

    def _wind_down(self, rollout: RolloutRow, rows: list[RolloutDevice]) -> None:
        """Cancel what was not taken, roll back what was, each row once.

        Run again on every tick of a stopped rollout: a leader killed half-way through (the status
        saved, some rows not handled yet) leaves the rest to whichever controller leads next."""
        for row in rows:
            if row.status == D.PLANNED:
                self._set(rollout, row, D.CANCELLED, "never sent")
            elif row.status == D.DEFERRED:  # replace the retained desired state it has not taken
                row.desired = self.publisher.desired(row.device_id, revert_message(self.sets, rollout.spec, rollout.id, row))
                self._set(rollout, row, D.CANCELLED, "offline: its desired state was withdrawn")
            elif row.status in IN_FLIGHT and not row.data.get(WITHDRAWN):
                # Not taken yet: withdraw the retained desired state; if it still commits, it is rolled back then.
                row.desired = self.publisher.desired(row.device_id, revert_message(self.sets, rollout.spec, rollout.id, row))
                row.data[WITHDRAWN] = True
                self.store.save_rollout_device(row)
            elif self.reports.took(row):
                self.reports.roll_back(rollout, row)

    def _set(self, rollout: RolloutRow, row: RolloutDevice, status: DeviceStatus, detail: str) -> None:
        row.status, row.detail = status, detail
        self.store.save_rollout_device(row)
        self.store.audit(f"device {status}", detail, rollout.id, row.device_id)

    def _finish_stop(self, rollout: RolloutRow, rows: list[RolloutDevice]) -> None:
        """Wait for rollbacks and in-flight installs to report, up to the wave timeout."""
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
