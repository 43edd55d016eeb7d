"""Applying what devices report to their rollout rows: events, retained state, reconnects.

Reports are idempotent (QoS 1 redelivers): a row changes only on a real transition, and a
rollback command, which agents do not treat idempotently (a second one drops the previous model
too), is sent again only when the device's own state shows it still runs the new model after a
reconnect, or when the broker never acknowledged the first one.

A device may be in rollouts of several models at once: an event about another model (its
``model``) than a rollout's is not that rollout's, and a state is read for the rollout's model only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from edgecore.protocol.reports import DeviceEvent, DeviceState, RunningModel
from edgectl.controller.composition import Composer, revert_message
from edgectl.controller.records import (
    IN_FLIGHT,
    UNSENT,
    DeviceStatus,
    PackageRef,
    RolloutDevice,
    RolloutRow,
    RolloutStatus,
    served_models,
)
from edgectl.controller.sets import SetMessage, desired_seq
from edgectl.controller.store import Store

__all__ = ["Publisher", "Reports", "desired_seq", "runs"]

D = DeviceStatus
# A rollout in one of these no longer wants its model anywhere: a device that commits it is rolled back.
STOPPED = (RolloutStatus.ROLLING_BACK, RolloutStatus.ABORTING, RolloutStatus.ROLLED_BACK, RolloutStatus.ABORTED)
REPLAY = "stale or replayed"  # how agents word the rejection of a message they already hold


class Publisher(Protocol):
    """How the engine reaches devices; the service implements it over MQTT."""

    def desired(self, device_id: str, message: SetMessage) -> bytes:
        """Sign ``message`` (a fresh sequence number), publish it retained, and return the signed desired state."""

    def rollback(self, rollout: RolloutRow, device_id: str, message: SetMessage) -> tuple[bool, bytes]:
        """Send a signed rollback command of the rollout's deployment, then ``message`` as the desired state:
        (command acknowledged, desired state)."""

    def send(self, device_id: str, leaf: str, payload: bytes) -> bool:
        """Publish to one device's topic; False when the broker did not take it."""

    def expect(self, rollout: RolloutRow, rows: list[RolloutDevice]) -> None:
        """Tell the artifact server these devices are about to ask: it publishes once all asked, not before."""


def runs(state: DeviceState, package: PackageRef) -> bool:
    """Whether a device's state lists this package among what it serves: versions may share a payload."""
    served = next((m for m in served_models(state) if m.name == package.name), None)
    return _is(served, package)


def _is(served: RunningModel | None, package: PackageRef) -> bool:
    return served is not None and (served.name, served.version, served.artifact_id) == (
        package.name, package.version, package.artifact_id)


class Reports:
    """Device reports to rollout rows: the engine's collaborator that applies what devices say, and rolls back.

    The engine (waves, gates, operator requests) holds one and calls :meth:`roll_back` and
    :meth:`took` when it halts; the service hands it events, states and births as they come."""

    def __init__(self, store: Store, publisher: Publisher, clock: Callable[[], float] = time.time,
                 sets: Composer | None = None) -> None:
        self.store = store
        self.publisher = publisher
        self.clock = clock
        self.sets = sets or Composer(store)

    def _rows(self, device_id: str) -> list[tuple[RolloutRow, RolloutDevice]]:
        """The device's rows in every rollout that sent it something."""
        rollouts: dict[str, RolloutRow | None] = {}
        found = []
        for row in self.store.device_rollouts(device_id):
            if row.status in UNSENT:
                continue
            if row.rollout_id not in rollouts:
                rollouts[row.rollout_id] = self.store.rollout(row.rollout_id)
            rollout = rollouts[row.rollout_id]
            if rollout is not None:
                found.append((rollout, row))
        return found

    # -- events -----------------------------------------------------------------------------------

    def on_event(self, device_id: str, event: DeviceEvent) -> None:
        """An event from ``device_id``: the id its topic names, which the broker binds to its certificate."""
        for rollout, row in self._rows(device_id):
            if event.model is not None and event.model != rollout.spec.model:
                continue  # about another model of the device's set (its removal, say), under this change's id
            if event.deployment_id == rollout.id:
                self._apply(rollout, row, event.status, event.state, event.detail, event.data)
            elif _refusal(event) and row.status in (*IN_FLIGHT, D.DEFERRED):
                self._apply(rollout, row, "failed", "rejected", event.detail, {})

    def _apply(self, rollout: RolloutRow, row: RolloutDevice, status: str, state: str, detail: str, data: dict[str, Any]) -> None:
        before = row.status
        after = _next_status(before, status, state)
        if after == before and before in (D.OK, D.ROLLBACK_SENT, D.ROLLED_BACK):
            return  # a redelivered or late report changes nothing
        row.status, row.state, row.detail = after, state, detail
        row.data.update({k: v for k, v in data.items() if v is not None})
        if after == D.OK and before != D.OK:
            row.installed_at = self.clock()
            p95 = data.get("health_p95_ms")
            if p95 is not None and data.get("model"):
                model, version = str(data["model"]), int(data.get("version", 0))
                self.store.add_latency(row.device_id, model, version, float(p95), "health", self.clock())
        self.store.save_rollout_device(row)
        if after != before:
            self.store.audit(f"device {after}", f"{state}: {detail}", rollout.id, row.device_id)
        if after == D.OK and before != D.OK and rollout.status in STOPPED:
            self.roll_back(rollout, row)

    # -- retained state and reconnects ------------------------------------------------------------

    def on_state(self, device_id: str, state: DeviceState) -> None:
        """Catch up on reports missed while the controller was down: the retained state tells."""
        if state.deployment is not None:
            return
        for rollout, row in self._rows(device_id):
            holds = runs(state, rollout.spec.package(row.variant))
            if row.status in (*IN_FLIGHT, D.DEFERRED, D.FAILED) and holds:
                self._apply(rollout, row, "ok", "done", "committed (from the device's state)", {})
            elif row.status == D.ROLLBACK_SENT and not holds:
                self._apply(rollout, row, "rolled-back", "rollback", "rolled back (from the device's state)", {})
            elif row.status == D.ROLLBACK_SENT and row.rollback_due:
                self.roll_back(rollout, row)

    def on_birth(self, device_id: str) -> None:
        """The device (re)connected just now: a rollback command sent before may never have reached it."""
        for _rollout, row in self._rows(device_id):
            if row.status == D.ROLLBACK_SENT and not row.rollback_due:
                row.rollback_due = True
                self.store.save_rollout_device(row)

    def republish(self) -> int:
        """After a (re)connect: put back each device's newest kept desired state it has not taken yet
        (a restarted broker lost it), and resend the rollbacks the broker never acknowledged."""
        newest: dict[str, tuple[RolloutDevice, bytes]] = {}
        for rollout in self.store.rollouts():
            for row in self.store.rollout_devices(rollout.id):
                if row.desired is None or row.status in UNSENT:
                    continue
                kept = newest.get(row.device_id)  # rollouts of several models: the one signed last is the whole set
                if kept is None or desired_seq(row.desired) > desired_seq(kept[1]):
                    newest[row.device_id] = (row, row.desired)
        count = 0
        for device_id, (row, desired) in newest.items():
            device = self.store.device(device_id)
            if device is not None and device.decommissioned is not None:
                continue  # taken out of the fleet: its desired state was cleared on the broker for good
            if desired_seq(desired) > (device.last_seq if device else 0):
                self.publisher.send(device_id, "desired", desired)
                count += 1
            if row.status == D.ROLLBACK_SENT and row.rollback_due and device is not None and device.state is not None:
                self.on_state(device_id, device.state)
        return count

    # -- rollback ---------------------------------------------------------------------------------

    @staticmethod
    def took(row: RolloutDevice) -> bool:
        """The device committed the new model (it may have gone silent since)."""
        return row.status == D.OK or (row.status == D.FAILED and row.installed_at is not None)

    def roll_back(self, rollout: RolloutRow, row: RolloutDevice) -> None:
        resent = row.status == D.ROLLBACK_SENT
        # Saved before it is sent: a leader killed in between leaves it due, and the next one resends
        # it only while the device's state shows the new model, instead of rolling back blindly again.
        row.status, row.rollback_due = D.ROLLBACK_SENT, True
        self.store.save_rollout_device(row)
        acked, row.desired = self.publisher.rollback(rollout, row.device_id,
                                                     revert_message(self.sets, rollout.spec, rollout.id, row))
        row.rollback_due = not acked
        self.store.save_rollout_device(row)
        self.store.audit("device rollback-sent", "again, after a reconnect" if resent else "", rollout.id, row.device_id)


def _refusal(event: DeviceEvent) -> bool:
    """The device refused a message, not tied to a deployment (signature, expiry, address).

    A replay refusal only says it already holds what a republish sent again."""
    return event.deployment_id == "none" and event.status == "rejected" and REPLAY not in event.detail


def _next_status(before: DeviceStatus, status: str, state: str) -> DeviceStatus:
    """A row's status after a report: ``status`` and ``state`` as the device sent them."""
    if before in (D.ROLLBACK_SENT, D.ROLLED_BACK):
        return D.ROLLED_BACK if status == "rolled-back" and state == "rollback" else before
    if status == "ok":
        return D.OK
    if status == "rolled-back":  # on our command; otherwise the device undid a failed install itself
        return D.ROLLED_BACK if state == "rollback" else D.FAILED
    if status in ("failed", "rejected"):
        return D.FAILED
    if status == "running" and before in (D.SENT, D.DEFERRED):
        return D.RUNNING
    return before
