"""The update state machine: states, events, one transition table, saved before every step.

Each state's handler returns an :class:`Event`; only :data:`TRANSITIONS` decides what comes next.
The deployment record is saved atomically *before* a state runs, so a crash or power cut at any
point restarts in a known state; :data:`RECOVERY` maps the saved state to where a restarted agent
resumes, and anything unknown means roll back. A per-state entry counter stops crash loops.
A state whose record cannot be saved (a full disk) does not run: it fails, and the failure and
rollback states clean up whatever happens to their own record.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from agent.deploy.record import Deployment, Options, Outcome, State
from edgecore.durable import atomic_write_json

__all__ = ["RECOVERY", "TRANSITIONS", "Deployment", "Event", "Machine", "Options", "Outcome", "State", "load_record"]

log = logging.getLogger(__name__)


class Event(enum.Enum):
    SUCCESS = "success"
    FAILURE = "failure"


TRANSITIONS: Mapping[tuple[State, Event], State] = {
    (State.DOWNLOAD, Event.SUCCESS): State.VERIFY,
    (State.DOWNLOAD, Event.FAILURE): State.FAILURE,
    (State.VERIFY, Event.SUCCESS): State.STAGE,
    (State.VERIFY, Event.FAILURE): State.FAILURE,
    (State.STAGE, Event.SUCCESS): State.SHADOW,
    (State.STAGE, Event.FAILURE): State.FAILURE,
    (State.SHADOW, Event.SUCCESS): State.ACTIVATE,
    (State.SHADOW, Event.FAILURE): State.FAILURE,
    (State.ACTIVATE, Event.SUCCESS): State.HEALTH,
    (State.ACTIVATE, Event.FAILURE): State.ROLLBACK,
    (State.HEALTH, Event.SUCCESS): State.COMMIT,
    (State.HEALTH, Event.FAILURE): State.ROLLBACK,
    (State.COMMIT, Event.SUCCESS): State.DONE,
    (State.COMMIT, Event.FAILURE): State.ROLLBACK,
    (State.ROLLBACK, Event.SUCCESS): State.DONE,
    (State.ROLLBACK, Event.FAILURE): State.DONE,
    (State.FAILURE, Event.SUCCESS): State.DONE,
    (State.FAILURE, Event.FAILURE): State.DONE,
}

# Where a restarted agent resumes. Anything after the pointer may have switched rolls back.
RECOVERY: Mapping[State, State] = {
    State.DOWNLOAD: State.DOWNLOAD,
    State.VERIFY: State.VERIFY,
    State.STAGE: State.STAGE,
    State.SHADOW: State.SHADOW,
    State.ACTIVATE: State.ROLLBACK,
    State.HEALTH: State.ROLLBACK,
    State.COMMIT: State.COMMIT,
    State.ROLLBACK: State.ROLLBACK,
    State.FAILURE: State.FAILURE,
    State.DONE: State.DONE,
}

def load_record(path: Path) -> Deployment | None:
    """The saved deployment in the state a restarted agent resumes it in, or None."""
    return Deployment.load(path, RECOVERY)


# States that run even when their record cannot be saved: they only clean up and never raise, and
# what they free (a download, a slot) is what a full disk needs back.
ALWAYS_RUN = frozenset({State.ROLLBACK, State.FAILURE})

Handler = Callable[[Deployment], Event]


class Machine:
    """Runs one deployment to DONE, saving it before each state and reporting each transition."""

    def __init__(
        self,
        record_path: Path,
        handlers: Mapping[State, Handler],
        report: Callable[[Deployment], None],
        max_entries: int = 3,
        pause_in: Callable[[State], None] | None = None,
    ) -> None:
        self.record_path = record_path
        self.handlers = handlers
        self.report = report
        self.max_entries = max_entries
        # Test seam: called after the state is saved and before it runs (kill tests pause here).
        self.pause_in = pause_in
        self.save_error = ""

    def run(self, deployment: Deployment) -> Deployment:
        while not _finished(deployment):
            saved = self._enter(deployment)
            if _finished(deployment):  # a crash loop ended it: saved and reported as it entered DONE
                return deployment
            if saved or deployment.state in ALWAYS_RUN:
                event = self._step(deployment)
            else:  # a state that may not be resumed correctly must not act
                deployment.reason = f"{deployment.state.value}: cannot save the deployment record: {self.save_error}"
                log.error("deployment %s: %s", deployment.deployment_id, deployment.reason)
                event = Event.FAILURE
            deployment.state = TRANSITIONS[(deployment.state, event)]
        self.save(deployment)
        self.report(deployment)
        return deployment

    def _enter(self, deployment: Deployment) -> bool:
        """Count the entry, stop crash loops, save and report; False when the record could not be saved."""
        key = deployment.state.value
        deployment.entries[key] = deployment.entries.get(key, 0) + 1
        if deployment.entries[key] > self.max_entries:
            # The agent died in this state again and again: stop the loop.
            escape = State.ROLLBACK if deployment.state not in (State.ROLLBACK, State.FAILURE) else State.DONE
            deployment.reason = f"crash loop: entered {key} {deployment.entries[key] - 1} times"
            log.error("%s; going to %s", deployment.reason, escape.value)
            if escape is State.DONE:
                deployment.outcome = deployment.outcome or Outcome.FAILED
            deployment.state = escape
            deployment.entries[escape.value] = deployment.entries.get(escape.value, 0) + 1
        saved = self.save(deployment)
        self.report(deployment)
        if self.pause_in is not None:
            self.pause_in(deployment.state)
        return saved

    def _step(self, deployment: Deployment) -> Event:
        handler = self.handlers[deployment.state]
        started = time.monotonic()
        try:
            event = handler(deployment)
        except Exception as exc:  # a handler bug must not leave the device half-updated
            log.exception("state %s failed unexpectedly", deployment.state.value)
            deployment.reason = f"{deployment.state.value}: internal error: {exc}"
            event = Event.FAILURE
        log.info("%s: %s in %.2fs", deployment.state.value, event.value, time.monotonic() - started)
        return event

    def save(self, deployment: Deployment) -> bool:
        """Save the record; on a full disk (or any write error) keep going and say so."""
        try:
            atomic_write_json(self.record_path, deployment.to_dict())
        except OSError as exc:
            self.save_error = f"{exc.strerror or exc}"
            log.error("cannot save deployment %s in %s: %s", deployment.deployment_id, deployment.state.value, exc)
            return False
        return True


def _finished(deployment: Deployment) -> bool:
    return deployment.state is State.DONE
