"""The worker's queue of model-changing jobs, saved so that an acknowledged desired state survives a power cut.

Deployments, rollbacks and remeasurements all change which model serves, so they run on one
worker, one at a time, in the order they were accepted. A job is written (fsynced) to
``<state>/jobs.json`` *before* the message that asked for it is acknowledged (its sequence number
saved), and leaves the file only once it has finished, so a restart finds every job it owes.

The message's sequence number is saved in the same write as its job (``accepted_seq``, the highest
one queued, kept after the job leaves): the ledger is written just after, and a power cut between
the two writes must not let the broker's retained copy of the message, handed back on the next
connection, pass for a new one and run the deployment a second time. :meth:`Worker.recover
<agent.deploy.worker.Worker.recover>` raises the ledger to it before the agent connects.

A deployment job holds a whole desired set, which the worker applies unit by unit
(``agent.deploy.plan``); each unit deployed is noted in the job (``done``), so a restart goes on
with the units not yet done. A new set supersedes the sets still waiting (only the newest desired
state matters); :meth:`JobQueue.put` returns them so the agent can report them, and a set being
applied stops before its next unit (:meth:`JobQueue.newer_deploy`). Each job gets a ticket that
only grows; the deployment record carries its job's ticket, so on restart the jobs before the one
whose record exists are known to have ended and are not run twice.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.deploy.plan import Wanted
from edgecore.durable import atomic_write_json, read_json
from edgecore.errors import OperationFailed

__all__ = ["JOBS_SCHEMA", "Job", "JobKind", "JobQueue"]

log = logging.getLogger(__name__)

JOBS_SCHEMA = 3  # 2: accepted_seq (a schema 1 file reads with 0); 3: a deployment is a set (wanted, done)
_READABLE = (1, 2, JOBS_SCHEMA)


class JobKind(str, enum.Enum):
    DEPLOY = "deploy"  # apply a desired set
    ROLLBACK = "rollback"  # on the controller's command
    REMEASURE = "remeasure"


@dataclass(frozen=True)
class Job:
    """One piece of model-changing work.

    DEPLOY: ``deployment_id`` is the set's, ``wanted`` the whole set, ``done`` the units already
    deployed (so a restart does not deploy them twice). ROLLBACK: ``deployment_id`` the deployment
    to undo, or ``model`` the model whose last deployment to undo. REMEASURE: ``model`` ("": all)."""

    kind: JobKind
    deployment_id: str = ""
    wanted: tuple[Wanted, ...] = ()
    model: str = ""
    ticket: int = 0  # set by the queue
    done: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "deployment_id": self.deployment_id, "ticket": self.ticket,
                "wanted": [w.to_dict() for w in self.wanted], "model": self.model, "done": list(self.done)}

    @classmethod
    def from_dict(cls, data: Any) -> Job:
        if not isinstance(data, dict):
            raise TypeError("a job must be an object")
        if "wanted" in data:
            wanted = tuple(Wanted.from_dict(w) for w in data["wanted"])
        elif data.get("manifest"):  # a job from before sets: the set of its one model
            wanted = (Wanted.from_dict(data),)
        else:
            wanted = ()
        return cls(JobKind(data["kind"]), str(data["deployment_id"]), wanted, str(data.get("model", "")),
                   int(data["ticket"]), tuple(map(str, data.get("done", []))))


class JobQueue:
    """Jobs in ticket order, mirrored to a file; the main thread puts, the worker takes and finishes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._cond = threading.Condition()
        self._jobs, self._next, self._seq = self._read()
        self._running: int | None = None  # the ticket of the job the worker took

    @property
    def accepted_seq(self) -> int:
        """The highest sequence number of a message whose job was queued (0: none since schema 2)."""
        with self._cond:
            return self._seq

    def _read(self) -> tuple[list[Job], int, int]:
        raw = read_json(self.path)
        if raw is None:
            return [], 1, 0
        try:
            if raw.get("schema") not in _READABLE:
                raise ValueError(f"schema {raw.get('schema')!r}")
            jobs = sorted((Job.from_dict(j) for j in raw["jobs"]), key=lambda j: j.ticket)
            return jobs, max(int(raw["next_ticket"]), *(j.ticket + 1 for j in jobs), 1), int(raw.get("accepted_seq", 0))
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            # Written atomically, so only a hand edit gets here: the controller re-sends what matters.
            log.error("%s is unreadable (%s): starting with no queued jobs", self.path, exc)
            return [], 1, 0

    def _save(self, jobs: list[Job], next_ticket: int, seq: int) -> None:
        try:
            atomic_write_json(self.path, {"schema": JOBS_SCHEMA, "next_ticket": next_ticket, "accepted_seq": seq,
                                          "jobs": [j.to_dict() for j in jobs]})
        except OSError as exc:
            raise OperationFailed(f"cannot save the job queue: {exc.strerror or exc}") from exc

    def put(self, job: Job, seq: int = 0) -> tuple[Job, list[Job]]:
        """Queue ``job`` durably, with the sequence number of the message that asked for it, in one write; return the
        job with its ticket, and the waiting deployments it supersedes.

        Raises OperationFailed, with nothing changed, when the queue cannot be saved (a full disk)."""
        with self._cond:
            job = dataclasses.replace(job, ticket=self._next)
            # The running deployment is not superseded here: the agent cancels its download instead.
            superseded = [j for j in self._jobs if j.kind is JobKind.DEPLOY and j.ticket != self._running] \
                if job.kind is JobKind.DEPLOY else []
            jobs = [j for j in self._jobs if j not in superseded] + [job]
            self._save(jobs, self._next + 1, max(self._seq, seq))
            self._jobs, self._next, self._seq = jobs, self._next + 1, max(self._seq, seq)
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
                self._save(self._jobs, self._next, self._seq)
            except OperationFailed as exc:
                log.error("%s", exc)

    def progress(self, job: Job, unit: str) -> Job:
        """Note that ``job`` deployed ``unit`` (saved: a restart skips it); a failed save only means it runs again."""
        with self._cond:
            job = dataclasses.replace(job, done=(*job.done, unit))
            self._jobs = [job if j.ticket == job.ticket else j for j in self._jobs]
            try:
                self._save(self._jobs, self._next, self._seq)
            except OperationFailed as exc:
                log.error("%s", exc)
            return job

    def newer_deploy(self, job: Job) -> bool:
        """Whether a desired set accepted after ``job`` waits: what of ``job`` has not started gives way to it."""
        with self._cond:
            return any(j.kind is JobKind.DEPLOY and j.ticket > job.ticket for j in self._jobs)

    def drop_started(self, ticket: int) -> list[Job]:
        """At start-up: forget the jobs before ``ticket``, which the saved deployment record shows had ended.

        Job ``ticket`` itself stays: a set goes on with its units not yet done (:meth:`progress`)."""
        with self._cond:
            self._next = max(self._next, ticket + 1)
            dropped = [j for j in self._jobs if j.ticket < ticket]
            if dropped:
                self._jobs = [j for j in self._jobs if j.ticket >= ticket]
                try:
                    self._save(self._jobs, self._next, self._seq)
                except OperationFailed as exc:
                    log.error("%s", exc)
            return dropped

    def get(self, ticket: int) -> Job | None:
        with self._cond:
            return next((j for j in self._jobs if j.ticket == ticket), None)

    def pending(self) -> list[Job]:
        with self._cond:
            return list(self._jobs)
