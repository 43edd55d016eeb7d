"""The two-person rule: a large rollout, or one to a protected group, waits for a second operator.

A rollout needs approval when it sends to more devices than ``controller.approval.min_devices``
(0: no size needs it) or its selector is a group marked protected. It is recorded
``awaiting-approval`` and nothing is sent until an operator other than its creator approves it
(then it is ``scheduled``: the engine starts it at its start time, or at once) or someone rejects
it with a reason (``rejected``: its devices are cancelled). Both are applied here, through the
lifecycle table, in one commit with their audit entry: the engine never touches a rollout that
awaits approval, so the decision cannot race a tick.
"""

from __future__ import annotations

from edgecore.errors import NotFoundError, UserError
from edgectl.controller.groups import group_name
from edgectl.controller.lifecycle import RolloutEvent, advance
from edgectl.controller.planner import Plan
from edgectl.controller.records import DeviceStatus, RolloutRow, RolloutStatus
from edgectl.controller.schedule import iso_utc
from edgectl.controller.store import Store

__all__ = ["MAX_REASON", "ApprovalRefused", "approval_reason", "approve_rollout", "person", "reject_reason", "reject_rollout"]

MAX_REASON = 500


class ApprovalRefused(UserError):
    """The two-person rule: the operator who created a rollout may not approve it (the API answers 403)."""


def approval_reason(store: Store, selector: str, plan: Plan, min_devices: int) -> str:
    """Why this plan must wait for a second operator ("" when it need not)."""
    name = group_name(selector)
    group = store.group(name) if name is not None else None
    if group is not None and group.protected:
        return f"targets protected group {group.name}"
    if min_devices > 0 and len(plan.devices) > min_devices:
        return f"targets {len(plan.devices)} devices, more than controller.approval.min_devices ({min_devices})"
    return ""


def approve_rollout(store: Store, rollout_id: str, actor: str) -> RolloutRow:
    """Approve a rollout awaiting approval as ``actor``, who must not be its creator; it becomes ``scheduled``."""
    with store.batch():  # read and decided in one transaction: two approvers, or an abort, do not both apply
        rollout = _awaiting(store, rollout_id, "approve")
        if person(actor) == person(rollout.spec.created_by):
            raise ApprovalRefused(f"two-person rule: {actor} created rollout {rollout_id} and may not approve it; "
                                  "another operator must")
        rollout.status = advance(rollout.status, RolloutEvent.APPROVE)
        store.save_rollout(rollout)
        start = "at once" if rollout.spec.start_at is None else f"at {iso_utc(rollout.spec.start_at)}"
        store.audit("rollout approved", f"created by {rollout.spec.created_by}; {rollout.spec.approval}; starts {start}",
                    rollout_id, actor=actor)
    return rollout


def reject_rollout(store: Store, rollout_id: str, actor: str, reason: str) -> RolloutRow:
    """Reject a rollout awaiting approval, with a reason: it ends ``rejected`` and its devices are cancelled."""
    reason = reject_reason(reason)
    with store.batch():
        rollout = _awaiting(store, rollout_id, "reject")
        rollout.status = advance(rollout.status, RolloutEvent.REJECT)
        rollout.reason = f"rejected by {actor}: {reason}"
        store.save_rollout(rollout)
        for row in store.rollout_devices(rollout_id):
            if row.status == DeviceStatus.PLANNED:
                row.status, row.detail = DeviceStatus.CANCELLED, "rollout rejected"
                store.save_rollout_device(row)
        store.audit("rollout rejected", reason, rollout_id, actor=actor)
    return rollout


def person(actor: str) -> str:
    """Who an audit actor is, whatever the way in: ``api:alice`` and ``cli:alice`` are one person to the rule."""
    return actor.split(":", 1)[1] if ":" in actor else actor


def reject_reason(reason: str) -> str:
    """The reason, stripped; UserError naming ``reason`` unless it is one line of 1-MAX_REASON characters."""
    text = reason.strip()
    if not text or len(text) > MAX_REASON or "\n" in text:
        raise UserError(f"reason: say why in one line of 1-{MAX_REASON} characters")
    return text


def _awaiting(store: Store, rollout_id: str, action: str) -> RolloutRow:
    rollout = store.rollout(rollout_id)
    if rollout is None:
        raise NotFoundError(f"no rollout {rollout_id!r} (see `edgectl rollout list`)")
    if rollout.status != RolloutStatus.AWAITING_APPROVAL:
        raise UserError(f"cannot {action} rollout {rollout_id}: it is {rollout.status} ({action} applies to "
                        f"{RolloutStatus.AWAITING_APPROVAL})")
    return rollout
