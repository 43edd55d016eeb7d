"""The worker's queue of model-changing jobs, saved so that an acknowledged desired state survives a power cut.

Deployments, rollbacks and remeasurements all change which model serves, so they run on one
worker, one at a time, in the order they were accepted. A job is written (fsynced) to
``<state>/jobs.json`` *before* the message that asked for it is acknowledged (its sequence number
saved), and leaves the file only once it has finished, so a restart finds every job it owes.

A new deployment supersedes the deployments still waiting (only the newest desired state
matters); :meth:`JobQueue.put` returns them so the agent can report them. Each job gets a ticket
that only grows; the deployment record carries its job's ticket, so on restart the jobs up to the
one whose record exists are known to have started and are not run twice.
"""

from __future__ import annotations

import base64
import enum
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.deploy.record import Deployment, Options
from agent.durable import atomic_write_json, read_json
from agent.errors import OperationFailed

__all__ = ["JOBS_SCHEMA", "Job", "JobKind", "JobQueue"]

log = logging.getLogger(__name__)

JOBS_SCHEMA = 1


class JobKind(str, enum.Enum):
    DEPLOY = "deploy"
    ROLLBACK = "rollback"  # on the controller's command
    REMEASURE = "remeasure"


@dataclass(frozen=True)
class Job:
    """One piece of model-changing work; ``deployment_id`` names the deployment to install or to undo."""

    kind: JobKind
    deployment_id: str = ""
    manifest_bytes: bytes = b""
    options: Options = field(default_factory=Options)
    ticket: int = 0  # set by the queue

    def deployment(self) -> Deployment:
        return Deployment(self.deployment_id, self.manifest_bytes, options=self.options, ticket=self.ticket)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "deployment_id": self.deployment_id, "ticket": self.ticket,
                "manifest": base64.b64encode(self.manifest_bytes).decode(), "options": self.options.to_dict()}

    @classmethod
    def from_dict(cls, data: Any) -> Job:
        if not isinstance(data, dict) or not isinstance(data.get("options", {}), dict):
            raise TypeError("a job must be an object")
        return cls(JobKind(data["kind"]), str(data["deployment_id"]), base64.b64decode(data["manifest"]),
                   Options.from_dict(data.get("options", {})), int(data["ticket"]))


class JobQueue:
    """Jobs in ticket order, mirrored to a file; the main thread puts, the worker takes and finishes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._cond = threading.Condition()
        self._jobs, self._next = self._read()
        self._running: int | None = None  # the ticket of the job the worker took

    def _read(self) -> tuple[list[Job], int]:
        raw = read_json(self.path)
        if raw is None:
            return [], 1
        try:
            if raw.get("schema") != JOBS_SCHEMA:
                raise ValueError(f"schema {raw.get('schema')!r}")
            jobs = sorted((Job.from_dict(j) for j in raw["jobs"]), key=lambda j: j.ticket)
            return jobs, max(int(raw["next_ticket"]), *(j.ticket + 1 for j in jobs), 1)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            # Written atomically, so only a hand edit gets here: the controller re-sends what matters.
            log.error("%s is unreadable (%s): starting with no queued jobs", self.path, exc)
            return [], 1

    def _save(self, jobs: list[Job], next_ticket: int) -> None:
        try:
            atomic_write_json(self.path, {"schema": JOBS_SCHEMA, "next_ticket": next_ticket,
                                          "jobs": [j.to_dict() for j in jobs]})
        except OSError as exc:
            raise OperationFailed(f"cannot save the job queue: {exc.strerror or exc}") from exc

    def put(self, job: Job) -> tuple[Job, list[Job]]:
        """Queue ``job`` durably; return it with its ticket, and the waiting deployments it supersedes.

        Raises OperationFailed, with nothing changed, when the queue cannot be saved (a full disk)."""
        with self._cond:
            job = Job(job.kind, job.deployment_id, job.manifest_bytes, job.options, self._next)
            # The running deployment is not superseded here: the agent cancels its download instead.
            superseded = [j for j in self._jobs if j.kind is JobKind.DEPLOY and j.ticket != self._running] \
                if job.kind is JobKind.DEPLOY else []
            jobs = [j for j in self._jobs if j not in superseded] + [job]
            self._save(jobs, self._next + 1)
            self._jobs, self._next = jobs, self._next + 1
            self._cond.notify_all()
            return job, superseded

    def take(self, timeout: float) -> Job | None:
        """The oldest job, which stays queued until :meth:`finish`; None after ``timeout`` seconds with none."""
        with self._cond:
            if not self._jobs:
                self._cond.wait(timeout)
            if not self._jobs:
                return None
            self._running = self._jobs[0].ticket
            return self._jobs[0]

    def finish(self, job: Job) -> None:
        """Drop a job that ran; if that cannot be saved the job runs again after a restart (jobs are idempotent)."""
        with self._cond:
            self._jobs = [j for j in self._jobs if j.ticket != job.ticket]
            self._running = None
            try:
                self._save(self._jobs, self._next)
            except OperationFailed as exc:
                log.error("%s", exc)

    def drop_started(self, ticket: int) -> list[Job]:
        """At start-up: forget the jobs up to ``ticket``, which the saved deployment record shows were taken."""
        with self._cond:
            self._next = max(self._next, ticket + 1)
            dropped = [j for j in self._jobs if j.ticket <= ticket]
            if dropped:
                self._jobs = [j for j in self._jobs if j.ticket > ticket]
                try:
                    self._save(self._jobs, self._next)
                except OperationFailed as exc:
                    log.error("%s", exc)
            return dropped

    def pending(self) -> list[Job]:
        with self._cond:
            return list(self._jobs)
