"""The one thread that changes what is served: desired sets, rollbacks and remeasurements, in order.

The message loop only queues jobs (durably, see :mod:`agent.deploy.jobs`), so chunk delivery never
waits for a measurement or a model load, and no two changes ever race. A desired set is applied
here: admitted (it must fit the memory budget) before anything is touched, then its pipelines that
are gone removed, its changed units deployed one by one (each its own state machine run, noted in
the job when done; a unit with maintenance windows waits for one first, agent.deploy.window), and
its models that are gone removed. Other models keep serving throughout.

Before the agent serves anything after a restart, :meth:`Worker.recover` makes sure the slot
pointer names committed models: a deployment interrupted after it switched the pointer (ACTIVATE,
HEALTH, or a rollback in progress) puts its unit's previous models back first, so only a
deployment's own health check ever serves an uncommitted model.
"""

from __future__ import annotations

import functools
import logging
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from agent.admission import Admission
from agent.deploy.jobs import Job, JobKind, JobQueue
from agent.deploy.machine import Deployment, Machine, State, load_record
from agent.deploy.plan import Wanted, plan_set, unit_key
from agent.deploy.slots import ActiveModel, Slots
from agent.deploy.steps import Steps
from agent.deploy.sweep import sweep
from agent.deploy.window import Hold, WindowGate
from agent.model_host import ModelHost
from edgecore.windows import local_zone

__all__ = ["EventSink", "Worker"]

log = logging.getLogger(__name__)


class EventSink(Protocol):
    """How the worker reports what is not a machine state: (deployment_id, state, status, detail, data, model)."""

    def __call__(self, deployment_id: str, state: str, status: str, detail: str, data: dict[str, Any],
                 model: str | None = None) -> None: ...


class Worker:
    def __init__(self, state_dir: Path, machine: Machine, steps: Steps, slots: Slots, host: ModelHost,
                 event: EventSink, changed: Callable[[], None], stopping: threading.Event,
                 admission: Admission | None = None, on_idle: Callable[[], object] | None = None,
                 drain_s: float = 30.0, window: WindowGate | None = None) -> None:
        self.state_dir = state_dir
        self.record_path = state_dir / "deployment.json"
        self.jobs = JobQueue(state_dir / "jobs.json")
        self.machine = machine
        self.steps = steps
        self.slots = slots
        self.host = host
        self.event = event
        self.changed = changed  # publish state and telemetry: what is served may have changed
        self.stopping = stopping
        self.admission = admission
        self.on_idle = on_idle  # runs between jobs when none waits (agent.idle_remeasure), on this thread
        self.drain_s = drain_s  # a removed model's requests in flight get this long before its files go
        self.window = window or WindowGate(local_zone(None))  # a unit with maintenance windows waits for one
        self.current: Deployment | None = None  # the deployment running now
        self.applying: tuple[Wanted, ...] = ()  # the set being applied now (its admission is asked again after staging)
        self._resumed: Deployment | None = None
        self._finished: Deployment | None = None
        self._thread = threading.Thread(target=self._work, name="model-worker", daemon=True)
        steps.admission = self._admit_staged

    def recover(self) -> frozenset[str]:
        """At start-up, before serving: pick up the saved deployment; the names that must not be served until its
        rollback runs (its pointer may still name uncommitted models), usually none."""
        # A message whose job was saved counts as accepted even if the ledger's write after it was lost (a power cut).
        if self.jobs.accepted_seq > self.steps.ledger.last_seq:
            log.info("sequence %d was queued with its job but not in the ledger: accepting it now", self.jobs.accepted_seq)
            self.steps.ledger.accept_seq(self.jobs.accepted_seq)
        record = load_record(self.record_path)
        unsafe: frozenset[str] = frozenset()
        if record is not None:
            for job in self.jobs.drop_started(record.ticket):
                log.info("job %d (%s %s) had ended before the restart", job.ticket, job.kind.value, job.deployment_id)
            if record.state is State.DONE:
                self._note_done(record)
                if not record.reported:
                    self._finished = record  # killed between saving its end and reporting it: report it now
            else:
                log.info("resuming deployment %s (%s) in state %s", record.deployment_id, record.unit, record.state.value)
                self._resumed = record
                if not self.steps.restore_committed(record):
                    unsafe = frozenset(part.name for part in record.parts)
        keep = [part.manifest.payload.sha256 for part in self._resumed.parts] if self._resumed is not None else []
        names = [part.name for part in self._resumed.parts] if self._resumed is not None else []
        sweep(self.state_dir, self.slots, keep, names)
        return unsafe

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout_s: float) -> None:
        """Wait (after ``stopping`` is set) for the job in hand to end, at most ``timeout_s`` seconds."""
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    # -- the loop ---------------------------------------------------------------------------------

    def _work(self) -> None:
        if self._finished is not None:
            self.machine.report(self._finished)
            self._finished.reported = True
            self.machine.save(self._finished)
        if self._resumed is not None:  # an interrupted deployment finishes (or rolls back) first
            self._deploy(self._resumed)
            self._note_done(self._resumed)
            self._after_job()
        while not self.stopping.is_set():
            job = self.jobs.take(timeout=0.5)
            if job is None:
                self._idle()
                continue
            finished = True
            try:
                finished = self._run(job)
            except Exception:  # the worker must outlive any job
                log.exception("job %d (%s) failed", job.ticket, job.kind.value)
            finally:
                if finished:
                    self.jobs.finish(job)
                self._after_job()

    def _idle(self) -> None:
        if self.on_idle is None:
            return
        try:
            self.on_idle()
        except Exception:  # the worker must outlive its idle work too
            log.exception("idle work failed")

    def _after_job(self) -> None:
        sweep(self.state_dir, self.slots)
        self.changed()

    def _note_done(self, record: Deployment) -> None:
        """The job that ran ``record`` has deployed its unit: a restart must not deploy it again."""
        job = self.jobs.get(record.ticket)
        if job is not None and record.unit not in job.done:
            self.jobs.progress(job, record.unit)

    def _run(self, job: Job) -> bool:
        """Run ``job``; False when it stopped before its end (the agent stopping): it goes on after the restart."""
        if job.kind is JobKind.DEPLOY:
            return self._apply(job)
        if job.kind is JobKind.ROLLBACK:
            self._roll_back(job)
        else:
            self._remeasure(job.model)
        return True

    # -- desired sets -----------------------------------------------------------------------------

    def _apply(self, job: Job) -> bool:
        plan = plan_set(job.wanted, self.slots.actives())
        refusal = self.admission.check(job.wanted) if self.admission is not None else None
        if refusal is not None:  # before anything is touched
            ids = {job.deployment_id: None} | {w.deployment_id: w.name for unit in plan.units for w in unit}
            for deployment_id, model in ids.items():
                self.event(deployment_id, "admission", "failed", refusal.detail(), refusal.data(), model)
            log.warning("desired set %s refused: %s", job.deployment_id, refusal.detail())
            return True
        self.applying = job.wanted
        try:
            self._answer_unchanged(plan.unchanged)
            for name in plan.remove_pipelines:
                self._remove(job, name)
            for unit in self.window.in_order(plan.units):  # a unit held for its window holds back no other
                key = unit_key(unit)
                if key in job.done:
                    continue
                if self.stopping.is_set():
                    return False
                if self.jobs.newer_deploy(job):
                    self._superseded(job, unit)
                    continue
                hold = self.window.hold(unit, self.event, self.stopping, functools.partial(self.jobs.newer_deploy, job))
                if hold is Hold.STOPPING:
                    return False
                if hold is Hold.SUPERSEDED:
                    self._superseded(job, unit)
                    continue
                if hold is Hold.GO:
                    self._deploy(Deployment([w.part() for w in unit], ticket=job.ticket))
                job = self.jobs.progress(job, key)
            if not self.jobs.newer_deploy(job):
                for name in plan.remove_models:
                    self._remove(job, name)
        finally:
            self.applying = ()
        return True

    def _admit_staged(self, deployment: Deployment) -> str | None:
        """After staging measured the unit's new models: why the set being applied no longer fits, or None."""
        if self.admission is None or not self.applying:
            return None
        refusal = self.admission.check(self.applying)
        return None if refusal is None else refusal.detail()

    def _answer_unchanged(self, unchanged: tuple[Wanted, ...]) -> None:
        """An entry the device already runs under another deployment's id is answered (its rollout learns it is done)."""
        for entry in unchanged:
            active = self.slots.active(entry.name)
            if active is None or active.deployment_id == entry.deployment_id:
                continue
            m = entry.manifest
            self.event(entry.deployment_id, "commit", "ok", f"{m.name} v{m.version} is already active", {}, m.name)
            self.slots.relabel(entry.name, entry.deployment_id)

    def _superseded(self, job: Job, unit: tuple[Wanted, ...]) -> None:
        for entry in unit:
            self.event(entry.deployment_id, "done", "failed",
                       f"superseded by a newer desired state before {entry.name} v{entry.manifest.version} started",
                       {}, entry.name)

    def _deploy(self, deployment: Deployment) -> None:
        self.current = deployment
        try:
            self.machine.run(deployment)
            deployment.reported = True
            self.machine.save(deployment)
        finally:
            self.current = None

    def _remove(self, job: Job, name: str) -> None:
        """Stop serving ``name`` (the pointer first: a power cut after it leaves only files, which the sweep deletes),
        let its requests in flight end, then delete its files."""
        active = self.slots.active(name)
        if active is None:
            return
        self.slots.remove([name])
        retired = self.host.unload(name)
        if retired is not None and not retired.drained.wait(self.drain_s):
            log.warning("%s still had requests in flight after %gs: its files go anyway", name, self.drain_s)
        shutil.rmtree(self.slots.root / name, ignore_errors=True)
        self.event(job.deployment_id, "remove", "ok", f"{name} v{active.version} removed: the desired set no longer "
                   "names it", {"version": active.version, "kind": active.kind}, name)
        self.changed()

    # -- commands ---------------------------------------------------------------------------------

    def _roll_back(self, job: Job) -> None:
        """Put back the previous version of what a deployment installed (``job.deployment_id``) or of ``job.model``.

        One naming a deployment acts only while that deployment's models are active, so a repeated
        rollback (a controller re-sending after a reconnect) cannot go two versions back."""
        actives = self.slots.actives()
        if job.deployment_id:
            names = sorted(n for n, a in actives.items() if a.deployment_id == job.deployment_id)
        elif job.model:
            names = [job.model] if job.model in actives else []
        else:  # from before sets: the device's one model
            names = sorted(actives) if len(actives) == 1 else []
        what = job.deployment_id or job.model or "none"
        if not names:
            why = (f"the active models were not installed by {job.deployment_id}" if job.deployment_id
                   else f"{job.model} is not active" if job.model
                   else "no model is active" if not actives else "name a deployment or a model: several are active")
            self.event(what, "rollback", "ok", f"nothing to roll back: {why}", {}, job.model or None)
            return
        after: dict[str, ActiveModel | None] = self.slots.roll_back(*names)
        self.steps.serve(after)
        for name in names:
            self.event(what, "rollback", "rolled-back", "rolled back on command", {}, name)

    def _remeasure(self, model: str) -> None:
        names = [model] if model else sorted(self.host.models)
        actives = self.slots.actives()
        for name in names:
            active = actives.get(name)
            if active is not None and active.kind != "pipeline":
                self.host.load(active, remeasure=True)
                for pipeline in self.host.dependents(name):
                    self.host.load_pipeline(pipeline.active)
