"""The one thread that changes the served model: deployments, rollbacks and remeasurements, in order.

The message loop only queues jobs (durably, see :mod:`agent.deploy.jobs`), so chunk delivery never
waits for a measurement or a model load, and no two model changes ever race. Before the agent
serves anything after a restart, :meth:`Worker.recover` makes sure the slot pointer names a
committed model: a deployment interrupted after it switched the pointer (ACTIVATE, HEALTH, or a
rollback in progress) puts the previous model back first, so only a deployment's own health check
ever serves an uncommitted model.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.deploy.jobs import Job, JobKind, JobQueue
from agent.deploy.machine import Deployment, Machine, Outcome, State, load_record
from agent.deploy.slots import Slots
from agent.deploy.steps import Steps
from agent.deploy.sweep import sweep
from agent.model_host import ModelHost
from agent.protocol.manifest import manifest_sha256

__all__ = ["EventSink", "Worker"]

log = logging.getLogger(__name__)

# (deployment_id, state, status, detail, data): how the worker reports what is not a machine state.
EventSink = Callable[[str, str, str, str, dict[str, Any]], None]


class Worker:
    def __init__(self, state_dir: Path, machine: Machine, steps: Steps, slots: Slots, host: ModelHost,
                 event: EventSink, changed: Callable[[], None], stopping: threading.Event) -> None:
        self.state_dir = state_dir
        self.record_path = state_dir / "deployment.json"
        self.jobs = JobQueue(state_dir / "jobs.json")
        self.machine = machine
        self.steps = steps
        self.slots = slots
        self.host = host
        self.event = event
        self.changed = changed  # publish state and telemetry: the served model may have changed
        self.stopping = stopping
        self.current: Deployment | None = None  # the deployment running now
        self._resumed: Deployment | None = None
        self._finished: Deployment | None = None
        self._thread = threading.Thread(target=self._work, name="model-worker", daemon=True)

    def recover(self) -> bool:
        """At start-up, before serving: pick up the saved deployment; False if the pointer may name an uncommitted model."""
        record = load_record(self.record_path)
        safe = True
        if record is not None:
            for job in self.jobs.drop_started(record.ticket):
                log.info("job %d (%s %s) had started before the restart", job.ticket, job.kind.value, job.deployment_id)
            if record.state is State.DONE:
                if not record.reported:
                    self._finished = record  # killed between saving its end and reporting it: report it now
            else:
                log.info("resuming deployment %s in state %s", record.deployment_id, record.state.value)
                self._resumed = record
                safe = self.steps.restore_committed(record)
        keep = [self._resumed.manifest.payload.sha256] if self._resumed is not None else []
        sweep(self.state_dir, self.slots, keep)
        return safe

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout_s: float) -> None:
        """Wait (after ``stopping`` is set) for the job in hand to end, at most ``timeout_s`` seconds."""
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _work(self) -> None:
        if self._finished is not None:
            self.machine.report(self._finished)
            self._finished.reported = True
            self.machine.save(self._finished)
        if self._resumed is not None:  # an interrupted deployment finishes (or rolls back) first
            self._deploy(self._resumed)
            self._after_job()
        while not self.stopping.is_set():
            job = self.jobs.take(timeout=0.5)
            if job is None:
                continue
            try:
                self._run(job)
            except Exception:  # the worker must outlive any job
                log.exception("job %d (%s) failed", job.ticket, job.kind.value)
            finally:
                self.jobs.finish(job)
                self._after_job()

    def _after_job(self) -> None:
        sweep(self.state_dir, self.slots)
        self.changed()

    def _run(self, job: Job) -> None:
        if job.kind is JobKind.DEPLOY:
            current = self.host.current
            if current is not None and current.active.manifest_sha256 == manifest_sha256(job.manifest_bytes):
                m = current.manifest
                self.event(job.deployment_id, "commit", "ok", f"{m.name} v{m.version} is already active", {})
                return
            self._deploy(job.deployment())
        elif job.kind is JobKind.ROLLBACK:
            self._roll_back(job.deployment_id)
        elif job.kind is JobKind.REMEASURE and (active := self.slots.active()) is not None:
            self.host.load(active, remeasure=True)

    def _deploy(self, deployment: Deployment) -> None:
        self.current = deployment
        try:
            self.machine.run(deployment)
            deployment.reported = True
            self.machine.save(deployment)
        finally:
            self.current = None

    def _roll_back(self, deployment_id: str) -> None:
        """Put the previous model back; one naming a deployment acts only while that deployment's model is active.

        So a repeated rollback (a controller re-sending after a reconnect) cannot go two models back."""
        if deployment_id and not self._active_from(deployment_id):
            self.event(deployment_id, "rollback", "ok",
                       f"nothing to roll back: the active model was not installed by {deployment_id}", {})
            return
        active = self.slots.roll_back()
        self.host.load(active) if active else self.host.unload()
        self.event(deployment_id or "none", "rollback", "rolled-back", "rolled back on command", {})

    def _active_from(self, deployment_id: str) -> bool:
        record = load_record(self.record_path)
        active = self.slots.active()
        return (record is not None and record.deployment_id == deployment_id and record.outcome is Outcome.OK
                and active is not None and active.manifest_sha256 == manifest_sha256(record.manifest_bytes))
