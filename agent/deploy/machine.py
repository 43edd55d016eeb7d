"""The update state machine: states, events, one transition table, saved before every step.

Each state's handler returns an :class:`Event`; only :data:`TRANSITIONS` decides what comes next.
The deployment record is saved atomically *before* a state runs, so a crash or power cut at any
point restarts in a known state; :data:`RECOVERY` maps the saved state to where a restarted agent
resumes, and anything unknown means roll back. A per-state entry counter stops crash loops.
"""

from __future__ import annotations

import base64
import enum
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.durable import atomic_write_json, read_json
from agent.protocol.manifest import Manifest

__all__ = ["RECOVERY", "TRANSITIONS", "Deployment", "Event", "Machine", "State"]

log = logging.getLogger(__name__)


class State(str, enum.Enum):
    """States under their saved names: never rename a value, old agents' files use it."""

    DOWNLOAD = "download"
    VERIFY = "verify"
    STAGE = "stage"
    SHADOW = "shadow"
    ACTIVATE = "activate"
    HEALTH = "health"
    COMMIT = "commit"
    ROLLBACK = "rollback"
    FAILURE = "failure"
    DONE = "done"


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

RECORD_SCHEMA = 1


@dataclass
class Deployment:
    """Everything a deployment needs to resume after a restart; saved as ``deployment.json``."""

    deployment_id: str
    manifest_bytes: bytes
    state: State = State.DOWNLOAD
    entries: dict[str, int] = field(default_factory=dict)
    reason: str = ""
    outcome: str = ""  # ok | rolled-back | failed, set by the terminal states
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def manifest(self) -> Manifest:
        return Manifest.from_bytes(self.manifest_bytes)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": RECORD_SCHEMA, "deployment_id": self.deployment_id, "state": self.state.value,
            "manifest": base64.b64encode(self.manifest_bytes).decode(), "entries": self.entries,
            "reason": self.reason, "outcome": self.outcome, "data": self.data,
        }

    @classmethod
    def load(cls, path: Path) -> Deployment | None:
        """Read a saved record; an unknown state resumes as ROLLBACK, an unreadable record as None."""
        raw = read_json(path)
        if not isinstance(raw, dict) or raw.get("schema") != RECORD_SCHEMA:
            return None
        try:
            state = RECOVERY.get(State(raw["state"]), State.ROLLBACK)
        except ValueError:
            state = State.ROLLBACK
        try:
            return cls(
                deployment_id=str(raw["deployment_id"]), manifest_bytes=base64.b64decode(raw["manifest"]),
                state=state, entries=dict(raw.get("entries", {})), reason=str(raw.get("reason", "")),
                outcome=str(raw.get("outcome", "")), data=dict(raw.get("data", {})),
            )
        except (KeyError, TypeError, ValueError):
            return None


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

    def run(self, deployment: Deployment) -> Deployment:
        while deployment.state is not State.DONE:
            self._enter(deployment)
            if deployment.state is State.DONE:
                break
            event = self._step(deployment)
            deployment.state = TRANSITIONS[(deployment.state, event)]
        self._save(deployment)
        self.report(deployment)
        return deployment

    def _enter(self, deployment: Deployment) -> None:
        key = deployment.state.value
        deployment.entries[key] = deployment.entries.get(key, 0) + 1
        if deployment.entries[key] > self.max_entries:
            # The agent died in this state again and again: stop the loop.
            escape = State.ROLLBACK if deployment.state not in (State.ROLLBACK, State.FAILURE) else State.DONE
            deployment.reason = f"crash loop: entered {key} {deployment.entries[key] - 1} times"
            log.error("%s; going to %s", deployment.reason, escape.value)
            if escape is State.DONE:
                deployment.outcome = deployment.outcome or "failed"
            deployment.state = escape
            deployment.entries[escape.value] = deployment.entries.get(escape.value, 0) + 1
        self._save(deployment)
        self.report(deployment)
        if self.pause_in is not None:
            self.pause_in(deployment.state)

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

    def _save(self, deployment: Deployment) -> None:
        atomic_write_json(self.record_path, deployment.to_json())
