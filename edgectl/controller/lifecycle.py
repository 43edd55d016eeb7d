"""The rollout lifecycle: one table of (status, event) -> status that every status change goes through.

Operator requests (pause, resume, abort, retry-failed), a second operator's decision on a rollout
awaiting approval (approve, reject) and the engine's own verdicts (the start time came, a gate
failed, the last wave was promoted, every device of a stopped rollout confirmed or the wait timed
out) are events; :func:`advance` looks the pair up and refuses one the table does not hold, so a
status can never move in a way nobody wrote down. The phases of a wave (``start`` -> ``installing``
-> ``baking`` -> next wave's ``start``) are the engine's; only statuses live here.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from edgecore.errors import InternalError
from edgectl.controller.records import RolloutStatus

__all__ = ["DECISIONS", "REQUESTS", "TRANSITIONS", "IllegalTransition", "RolloutEvent", "advance", "applies_to"]

S = RolloutStatus


class RolloutEvent(str, enum.Enum):
    # Operator requests, under the names `edgectl rollout ACTION` and the store's request queue use.
    PAUSE = "pause"
    RESUME = "resume"
    ABORT = "abort"
    RETRY_FAILED = "retry-failed"
    # A second operator's decision (two-person rule, edgectl.fleet.approvals), applied where it is made.
    APPROVE = "approve"
    REJECT = "reject"
    # The engine's verdicts.
    START = "start"  # a scheduled rollout's start time came (at once when it has none)
    HALT = "halt"  # a gate failed (or a shadow run disagreed): roll the wave back
    COMPLETE = "complete"  # the last wave was promoted
    SETTLED = "settled"  # a halted or aborted rollout: every device confirmed, or the wave timeout passed


E = RolloutEvent

TRANSITIONS: Mapping[tuple[RolloutStatus, RolloutEvent], RolloutStatus] = {
    (S.AWAITING_APPROVAL, E.APPROVE): S.SCHEDULED,  # then it starts at its start time, or at once
    (S.AWAITING_APPROVAL, E.REJECT): S.REJECTED,  # nothing was sent: its devices are cancelled
    (S.AWAITING_APPROVAL, E.ABORT): S.ABORTING,  # cancelled before it started (settles on the next tick)
    (S.SCHEDULED, E.ABORT): S.ABORTING,
    (S.SCHEDULED, E.START): S.RUNNING,
    (S.RUNNING, E.PAUSE): S.PAUSED,  # no wave starts or promotion; gates keep watching
    (S.PAUSED, E.RESUME): S.RUNNING,
    (S.RUNNING, E.ABORT): S.ABORTING,
    (S.PAUSED, E.ABORT): S.ABORTING,
    (S.RUNNING, E.RETRY_FAILED): S.RUNNING,
    (S.PAUSED, E.RETRY_FAILED): S.PAUSED,
    (S.DONE, E.RETRY_FAILED): S.RUNNING,  # the failed devices join the last wave, which bakes again
    (S.RUNNING, E.HALT): S.ROLLING_BACK,
    (S.PAUSED, E.HALT): S.ROLLING_BACK,
    (S.RUNNING, E.COMPLETE): S.DONE,
    (S.ROLLING_BACK, E.SETTLED): S.ROLLED_BACK,
    (S.ABORTING, E.SETTLED): S.ABORTED,
}

# Operator requests and the statuses each applies to, read off the table.
REQUESTS: Mapping[str, tuple[RolloutStatus, ...]] = {
    event.value: tuple(status for (status, e) in TRANSITIONS if e is event)
    for event in (E.PAUSE, E.RESUME, E.ABORT, E.RETRY_FAILED)
}

# A second operator's decisions and the statuses each applies to, read off the table (applied by edgectl.fleet.approvals).
DECISIONS: Mapping[str, tuple[RolloutStatus, ...]] = {
    event.value: tuple(status for (status, e) in TRANSITIONS if e is event) for event in (E.APPROVE, E.REJECT)
}


class IllegalTransition(InternalError):
    """An event the table holds no transition for in this status (an internal bug, or a stale request)."""


def advance(status: RolloutStatus, event: RolloutEvent) -> RolloutStatus:
    """The status after ``event``; raise :class:`IllegalTransition` when the table has no such edge."""
    try:
        return TRANSITIONS[(status, event)]
    except KeyError:
        raise IllegalTransition(f"rollout is {status.value}: {event.value} does not apply") from None


def applies_to(event: RolloutEvent, status: RolloutStatus) -> bool:
    return (status, event) in TRANSITIONS
