"""Maintenance windows and the forced-update deadline, as the engine applies them to a rollout's devices.

When a rollout is recorded, each device's windows are resolved once from the groups that hold it
(every group with windows: a device in two installs only when both allow it) and its own windows
(its device configuration's ``maintenance_windows``, else agent.yaml's as its birth said) and kept in its row
with the time zone its agent reported (:func:`window_data`); a later change of a group does not
move a running rollout. The engine sends a planned device only when its windows are open in its
own local time (:func:`hold_reason`), so a wave waits for its devices' windows; the desired state
carries the same windows and the deadline, and the agent holds the installation until its own
clock says so (agent/deploy/window.py). From the deadline on, windows no longer hold anything.

A device whose windows need a time zone its agent does not report (an agent from before windows,
or a machine without one) is not guessed at: it waits, and the row says why, until the deadline.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from edgecore.errors import UserError
from edgecore.windows import Maintenance, WindowError, Windows, zone
from edgectl.controller.groups import DeviceGroup, resolve_group
from edgectl.controller.planner import Plan, PlannedDevice
from edgectl.controller.records import DeviceRecord, RolloutDevice, RolloutSpec
from edgectl.controller.schedule import iso_utc

__all__ = ["OPENS_AT", "WINDOWS", "ZONE", "hold_reason", "maintenance_of", "noted_windows", "window_data"]

WINDOWS = "windows"  # row data: the device's window lists, one per group with windows
ZONE = "timezone"  # row data: the IANA zone its agent reported when the rollout was recorded
OPENS_AT = "window_opens_at"  # row data: when the device said it would install (its window_waiting event)


def window_data(groups: Sequence[DeviceGroup], records: Sequence[DeviceRecord],
                configured: Mapping[str, Sequence[str]] = {}) -> dict[str, dict[str, Any]]:
    """Row data for each device that has windows: one list per group with windows that holds it, and the device's
    own (the configuration the operators set for it in ``configured``, else what its birth reported from agent.yaml),
    with the time zone its agent reported."""
    by_id = {r.id: r for r in records}
    lists: dict[str, list[list[str]]] = {}
    for group in groups:
        if not group.windows:
            continue
        try:
            members = resolve_group(group, records)
        except UserError:  # a dynamic group whose query names a tag no device reports now holds no device
            continue
        for record in members:
            lists.setdefault(record.id, []).append(list(group.windows))
    for record in records:
        own = configured.get(record.id, record.birth.maintenance_windows if record.birth is not None else ())
        if own:
            lists.setdefault(record.id, []).append(list(own))
    return {device: {WINDOWS: found, ZONE: _zone_of(by_id[device])} for device, found in lists.items()}


def _zone_of(record: DeviceRecord) -> str | None:
    return record.birth.timezone if record.birth is not None else None


def maintenance_of(spec: RolloutSpec, row: RolloutDevice) -> Maintenance | None:
    """What the row's desired state tells the agent about when to install; None: at once."""
    return _maintenance(row.data, spec.deadline)


def hold_reason(spec: RolloutSpec, row: RolloutDevice, now: float) -> str | None:
    """Why the engine must not send the row's desired state now; None: it may."""
    return _held(row.data, spec.deadline, now)


def noted_windows(plan: Plan, windows: Mapping[str, Mapping[str, Any]], deadline: float | None, now: float) -> Plan:
    """The plan with each device that has windows noted: whether it would be sent now, or why and until when it
    would wait (what a dry run shows; the rows of a recorded rollout say the same as it runs)."""
    def noted(device: PlannedDevice) -> PlannedDevice:
        data = windows.get(device.device_id)
        if not data:
            return device
        note = _held(data, deadline, now) or "inside its maintenance windows now"
        return replace(device, reason="; ".join(n for n in (device.reason, note) if n))
    return replace(plan, devices=[noted(d) for d in plan.devices])


def _maintenance(data: Mapping[str, Any], deadline: float | None) -> Maintenance | None:
    maintenance = Maintenance(tuple(Windows.parse(texts) for texts in data.get(WINDOWS) or []), deadline)
    return maintenance if maintenance else None


def _held(data: Mapping[str, Any], deadline: float | None, now: float) -> str | None:
    maintenance = _maintenance(data, deadline)
    if maintenance is None or not maintenance.schedules:
        return None
    said_deadline = f"; the deadline {iso_utc(deadline)} sends it" if deadline is not None else ""
    name = data.get(ZONE)
    try:
        device_zone = zone(str(name)) if name else None
    except WindowError:
        device_zone = None
    if device_zone is None:
        if deadline is not None and now >= deadline:
            return None
        return f"waiting: its maintenance windows are in device time, and its agent reports no time zone{said_deadline}"
    opens = maintenance.allowed_from(now, device_zone)
    if opens is None:
        return f"waiting: its groups' maintenance windows never open together{said_deadline}"
    if opens <= now:
        return None
    local = datetime.fromtimestamp(opens, device_zone).strftime("%a %H:%M")
    return f"waiting for its maintenance window: opens {iso_utc(opens)} ({local} {name})"
