"""Whether a device can take the set a rollout makes for it: checked when the rollout is planned and again when sent.

Three reasons refuse a device (its row ``refused``, the reason in the row and the audit log, nothing
sent): its agent does not speak desired-state schema 2 and the set holds more than one model or a
pipeline (:func:`edgectl.controller.sets.schema_for`); a pipeline of the set runs a model the set
does not hold; or the set does not fit the memory budget the device reports, counted as its agent
counts it (:mod:`edgectl.controller.admission`). A set that fits by that count but not by what
devices of its target measured is sent, and flagged in the plan.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from edgectl.controller.admission import Footprints, predict
from edgectl.controller.composition import Composer
from edgectl.controller.records import DeviceRecord, DeviceStatus, PackageRef, RolloutDevice, RolloutSpec
from edgectl.controller.sets import DeviceSet, SetMessage, schema_for
from edgectl.controller.store import Store

__all__ = ["PLANNED_ID", "Screen", "Verdict"]

PLANNED_ID = "planned"  # the deployment id a set is composed under before its rollout is recorded


@dataclass(frozen=True)
class Verdict:
    """What a device gets: ``message`` to sign, or ``refusal``; ``note`` flags a likely refusal after staging."""

    message: SetMessage | None
    refusal: str = ""
    note: str = ""


class Screen:
    """Checks sets against the devices they go to; the footprints devices report are read once per :meth:`refresh`."""

    def __init__(self, store: Store, sets: Composer) -> None:
        self.store = store
        self.sets = sets
        self._footprints: Footprints | None = None

    def refresh(self, devices: Iterable[DeviceRecord] | None = None) -> None:
        """Read the footprints again at next use (or from ``devices``, as the caller already has them)."""
        self._footprints = None if devices is None else Footprints(devices)

    def verdict(self, rollout_id: str, device: DeviceRecord | None, wanted: DeviceSet) -> Verdict:
        """``wanted`` as the device's agent takes it, or why it must not be sent."""
        schema = schema_for(device.birth if device is not None else None, wanted)
        if isinstance(schema, str):
            return Verdict(None, f"refused: {schema}")
        for pipeline in wanted.pipelines:
            missing = [n for n in pipeline.ref.needs if n not in {m.name for m in wanted.models}]
            if missing:
                return Verdict(None, f"refused: pipeline {pipeline.label()} runs {', '.join(missing)}, which the device's "
                                     "set does not hold")
        if self._footprints is None:
            self._footprints = Footprints(self.store.devices())
        admission = predict(device, wanted, self._footprints)
        if admission.refused:
            return Verdict(None, f"refused: {admission.detail()}")
        note = admission.detail() if admission.likely_refused else ""
        return Verdict(SetMessage(wanted.device_id, rollout_id, schema, (*wanted.models, *wanted.pipelines)), note=note)

    def planned(self, spec: RolloutSpec, device: DeviceRecord, ref: PackageRef, wave: int) -> Verdict:
        """The verdict for a device of a rollout not recorded yet (``spec`` with the plan's packages)."""
        row = RolloutDevice(PLANNED_ID, device.id, wave, ref.variant, DeviceStatus.PLANNED)
        wanted, _ = self.sets.for_send(spec, row, device, PLANNED_ID)
        return self.verdict(PLANNED_ID, device, wanted)
