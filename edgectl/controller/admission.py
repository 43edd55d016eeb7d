"""Predicting a device's admission of a set from the footprints devices report (docs/protocol.md, Admission).

A device admits a set when the footprints of everything it would serve add up to at most its
budget (``state.memory_budget_mb``). It counts, for each model, the footprint it measured itself,
or, for one it has not measured yet, the size of its model files: a lower bound, since the weights
must be in memory. The controller counts the same way (:attr:`Admission.bound_mb`), so a set whose
bound exceeds the budget is one the device would refuse before touching anything: it is refused here
and not sent. It also estimates (:attr:`Admission.estimate_mb`) with what other devices of the
same target measured for the models this one has not run yet; a set that fits by the bound but
not by that estimate is flagged: the device is likely to refuse it after staging.

A device that reports no budget (an agent from before admission) is neither refused nor flagged:
its admission is unknown, and said so.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from edgectl.controller.records import DeviceRecord
from edgectl.controller.sets import DeviceSet, Entry

__all__ = ["MIB", "Admission", "Footprints", "Part", "predict"]

MIB = float(1 << 20)


class Footprints:
    """What devices measured, per model version and target: (name, version, target) -> the largest footprint in MiB."""

    def __init__(self, devices: Iterable[DeviceRecord]) -> None:
        self._mb: dict[tuple[str, int, str], tuple[float, int]] = {}
        for device in devices:
            target = device.birth.target or "" if device.birth is not None else ""
            for m in device.models:
                if m.footprint_mb is not None:
                    key = (m.name, m.version, target)
                    most, count = self._mb.get(key, (0.0, 0))
                    self._mb[key] = (max(most, m.footprint_mb), count + 1)

    def measured(self, name: str, version: int, target: str) -> tuple[float, int] | None:
        """(largest footprint, devices that measured it) for this version on devices of ``target``."""
        return self._mb.get((name, version, target))


@dataclass(frozen=True)
class Part:
    """One entry's share: the bound the device counts, the estimate, and where each figure comes from."""

    label: str
    bound_mb: float | None  # None: no figure at all (a spec from before package weights were kept)
    estimate_mb: float | None
    source: str


@dataclass(frozen=True)
class Admission:
    """The prediction for one device and set."""

    budget_mb: float | None
    parts: tuple[Part, ...]

    @property
    def bound_mb(self) -> float:
        return sum(p.bound_mb or 0.0 for p in self.parts)

    @property
    def estimate_mb(self) -> float:
        return sum(p.estimate_mb if p.estimate_mb is not None else p.bound_mb or 0.0 for p in self.parts)

    @property
    def refused(self) -> bool:
        """The device would refuse the set before touching anything: even the bound exceeds its budget."""
        return self.budget_mb is not None and self.bound_mb > self.budget_mb

    @property
    def likely_refused(self) -> bool:
        """It fits by the bound, but not by what other devices measured: likely refused after staging."""
        return self.budget_mb is not None and not self.refused and self.estimate_mb > self.budget_mb

    def detail(self) -> str:
        """The numbers, as the device's own admission event words them."""
        if self.budget_mb is None:
            return "admission unknown: the device reports no memory budget (an agent from before admission)"
        parts = ", ".join(f"{p.label} {_mb(p.bound_mb)} {p.source}" for p in self.parts)
        budget = _mb(self.budget_mb)
        if self.refused:
            return f"the set needs at least {_mb(self.bound_mb)} MB ({parts}) and the budget is {budget} MB"
        measured = ", ".join(f"{p.label} {_mb(p.estimate_mb)}" for p in self.parts if p.estimate_mb is not None)
        if self.likely_refused:
            return (f"likely refused after staging: the set needs {_mb(self.estimate_mb)} MB by what devices of its target "
                    f"measured ({measured}) and the budget is {budget} MB")
        return f"fits: at least {_mb(self.bound_mb)} MB ({parts}) of a {budget} MB budget"


def _mb(value: float | None) -> str:
    """MiB as people read them: whole numbers, three figures below 100 (small models are a fraction of one)."""
    if value is None:
        return "?"
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def predict(device: DeviceRecord | None, device_set: DeviceSet, footprints: Footprints) -> Admission:
    """The admission of ``device_set`` on ``device``, as its agent would count it."""
    budget = device.state.memory_budget_mb if device is not None and device.state is not None else None
    target = device.birth.target or "" if device is not None and device.birth is not None else ""
    parts = tuple(_part(device, e, footprints, target) for e in (*device_set.models, *device_set.pipelines))
    return Admission(budget, parts)


def _part(device: DeviceRecord | None, entry: Entry, footprints: Footprints, target: str) -> Part:
    ref = entry.ref
    served = device.served(ref.name) if device is not None else None
    if served is not None and served.version == ref.version and served.footprint_mb is not None:
        return Part(entry.label(), served.footprint_mb, served.footprint_mb, "measured by the device")
    bound = None if ref.weights is None else ref.weights / MIB
    measured = footprints.measured(ref.name, ref.version, target)
    estimate = None if measured is None else max(measured[0], bound or 0.0)
    source = "model files, not measured yet" if bound is not None else "no figure (a package kept before its weights were)"
    return Part(entry.label(), bound, estimate, source)
