"""Catching up from the store: when a controller starts leading, and when the store answers again after an outage.

Reports that reached the store but not the rollouts (the previous leader died between the two, a
standby stored them, the store failed between them) are applied from each in-flight device's
stored state; a new leader also raises its sequence counter above every number the store knows
was signed, since the previous leader, on another host, may have counted ahead of this clock.
"""

from __future__ import annotations

from edgectl.controller.records import ACTIVE, IN_FLIGHT, DeviceStatus
from edgectl.controller.reports import Reports, desired_seq
from edgectl.controller.store import Store
from edgectl.sequence import raise_sequence_floor

__all__ = ["catch_up", "highest_sequence_sent"]

CATCH_UP = (*IN_FLIGHT, DeviceStatus.DEFERRED, DeviceStatus.ROLLBACK_SENT)


def catch_up(store: Store, reports: Reports, replicated: bool) -> None:
    """Apply each in-flight device's stored state to its rows; on a replicated store, raise the sequence floor first."""
    if replicated:
        raise_sequence_floor(highest_sequence_sent(store))
    for rollout in store.rollouts(ACTIVE):
        for row in store.rollout_devices(rollout.id):
            device = store.device(row.device_id) if row.status in CATCH_UP else None
            if device is not None and device.state is not None:
                reports.on_state(row.device_id, device.state)


def highest_sequence_sent(store: Store) -> int:
    """The highest number any leader signed that the store knows of: stored desired states, and
    what each device reports it accepted last (which covers commands)."""
    highest = max((d.last_seq for d in store.devices()), default=0)
    for rollout in store.rollouts(ACTIVE):
        for row in store.rollout_devices(rollout.id):
            if row.desired:
                highest = max(highest, desired_seq(row.desired))
    return highest
