"""Composing each device's set from the rollouts that reached it and what it reports it runs.

The set a device should run is not kept apart: it follows from the rollout rows, which are written
before anything is sent. For each name, the row of a rollout of that model whose desired state was
signed last has the say (:class:`Claim`):

=========================================================  ============================================
row                                                        says the name should be
=========================================================  ============================================
sent, deferred, running, ok; failed after it installed     the rollout's package for this device
rolled back, rollback sent, failed before installing,      what it was before the row's first send
withdrawn (a stopped rollout replaced its desired state)   (``previous_entry`` in the row's data)
planned, skipped, refused, superseded, never sent          nothing: no say
=========================================================  ============================================

A name no row has a say on is what the device reports it runs, named by a package some rollout
kept (:class:`Catalogue`); a model no kept package names is *unknown*: a set cannot name it, so
one is not sent as schema 2 (it would remove the model). Two rollouts of different models on one
device thus each change their own name, and a rollback of one puts back only its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from edgecore.errors import ProtocolError
from edgecore.protocol.topics import validate_id
from edgectl.artifacts.urls import urls_for
from edgectl.controller.gates import parse_gates
from edgectl.controller.maintenance import maintenance_of
from edgectl.controller.records import DeviceRecord, DeviceStatus, PackageRef, RolloutDevice, RolloutRow, RolloutSpec
from edgectl.controller.sets import DeviceSet, Entry, SetMessage, desired_seq, schema_for
from edgectl.controller.store import Store

__all__ = ["PREVIOUS", "WITHDRAWN", "Catalogue", "Claim", "Composer", "previous_json", "revert_message", "shadow_threshold"]

D = DeviceStatus
PREVIOUS = "previous_entry"  # a row's data: the entry its model had in the device's set before the row's first send
WITHDRAWN = "withdrawn"  # a row's data: a stopped rollout replaced its in-flight desired state
WANTS = (D.SENT, D.DEFERRED, D.RUNNING, D.OK)
GOES_BACK = (D.ROLLBACK_SENT, D.ROLLED_BACK, D.FAILED, D.CANCELLED)


def shadow_threshold(spec: RolloutSpec, wave: int) -> float | None:
    """The agreement a device must reach in a shadow run before cut-over: first-wave devices of a --shadow rollout."""
    if not spec.shadow or wave != 1:
        return None
    gates = parse_gates(spec.gates)
    return max((g.threshold for g in gates if g.metric == "agreement" and g.op in (">=", ">")), default=None)


def _seq(desired: bytes | None) -> int:
    return 0 if desired is None else desired_seq(desired)


@dataclass(frozen=True)
class Claim:
    """What one row says a name of the device's set should be: ``entry``, or nothing (None), or an ``unknown`` version."""

    seq: int  # the sequence number of the row's last desired state: the newest claim wins
    entry: Entry | None
    unknown: str = ""  # "name vN" that no kept package names


class Catalogue:
    """Every package this controller keeps (each rollout's variants), found by what a device reports it runs."""

    def __init__(self, rollouts: Iterable[RolloutRow]) -> None:
        self._found: dict[tuple[str, int], list[tuple[PackageRef, RolloutRow]]] = {}
        for rollout in rollouts:
            for ref in rollout.spec.packages:
                self._found.setdefault((ref.name, ref.version), []).append((ref, rollout))

    def find(self, name: str, version: int, artifact_id: str | None, target: str | None) -> Entry | None:
        """The kept package of ``name`` v``version`` for a device of ``target`` (its own target first, then ``any``)."""
        found = [(r, o) for r, o in self._found.get((name, version), []) if artifact_id in (None, r.artifact_id)]
        if not found:
            return None
        ref, rollout = max(found, key=lambda f: (f[0].target == target, f[0].target == "any", f[1].created))
        return Entry(ref, rollout.id, urls_for(rollout.spec.artifact_urls, ref.artifact_id))


class Composer:
    """Composes device sets from the store's rollout rows; one per engine (or per plan), :meth:`refresh` each tick."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._specs: dict[str, RolloutSpec] = {}  # specs never change once recorded
        self._catalogue: Catalogue | None = None

    def refresh(self) -> None:
        """Read the kept packages again at next use (a rollout was recorded since)."""
        self._catalogue = None

    @property
    def catalogue(self) -> Catalogue:
        if self._catalogue is None:
            rollouts = self.store.rollouts()
            self._specs.update((r.id, r.spec) for r in rollouts)
            self._catalogue = Catalogue(rollouts)
        return self._catalogue

    def _spec(self, rollout_id: str) -> RolloutSpec | None:
        if rollout_id not in self._specs:
            rollout = self.store.rollout(rollout_id)
            if rollout is None:
                return None
            self._specs[rollout_id] = rollout.spec
        return self._specs[rollout_id]

    def model_of(self, rollout_id: str) -> str:
        spec = self._spec(rollout_id)
        return spec.model if spec is not None else ""

    # -- sets -------------------------------------------------------------------------------------

    def current(self, device: DeviceRecord | None, device_id: str, leave_out: RolloutDevice | None = None,
                rows: list[RolloutDevice] | None = None) -> DeviceSet:
        """The set ``device_id`` should run now by its rows (all but ``leave_out``) and, for other names, its reports."""
        target = device.birth.target if device is not None and device.birth is not None else None
        claims: dict[str, Claim] = {}
        for row in self.store.device_rollouts(device_id) if rows is None else rows:
            if leave_out is not None and row.rollout_id == leave_out.rollout_id:
                continue
            spec = self._spec(row.rollout_id)
            claim = None if spec is None or not spec.packages else self.claim(spec, row, target)
            if claim is not None and (spec is not None) and claim.seq >= claims.get(spec.model, claim).seq:
                claims[spec.model] = claim
        entries = {name: c.entry for name, c in claims.items() if c.entry is not None}
        unknown = {name: c.unknown for name, c in claims.items() if c.unknown}
        for m in device.models if device is not None else ():
            if m.name in claims:
                continue
            entry = self.catalogue.find(m.name, m.version, m.artifact_id, target)
            if entry is None:
                unknown[m.name] = f"{m.name} v{m.version}"
            else:
                entries[m.name] = Entry(entry.ref, _kept_id(m.deployment_id, entry.deployment_id), entry.urls)
        return DeviceSet(device_id, entries, unknown)

    def claim(self, spec: RolloutSpec, row: RolloutDevice, target: str | None) -> Claim | None:
        """What ``row`` says its model should be on its device (see the module's table); None: no say."""
        seq = _seq(row.desired)
        withdrawn = bool(row.data.get(WITHDRAWN))
        if (row.status in WANTS and not withdrawn) or (row.status == D.FAILED and row.installed_at is not None):
            return Claim(seq, self.wanted(spec, row))
        if row.status in GOES_BACK or (row.status in WANTS and withdrawn):
            if row.status == D.CANCELLED and row.desired is None:
                return None  # never sent
            return self.previous(spec, row, target, seq)
        return None

    def wanted(self, spec: RolloutSpec, row: RolloutDevice, rollout_id: str | None = None) -> Entry:
        """The entry ``row``'s rollout puts on its device."""
        ref = spec.package(row.variant)
        return Entry(ref, rollout_id or row.rollout_id, urls_for(spec.artifact_urls, ref.artifact_id), spec.allow_downgrade,
                     shadow_threshold(spec, row.wave), maintenance_of(spec, row))

    def previous(self, spec: RolloutSpec, row: RolloutDevice, target: str | None, seq: int = 0) -> Claim:
        """What the row's model was on its device before the row's first send (going back to it is no downgrade refusal)."""
        if PREVIOUS in row.data:
            kept = row.data[PREVIOUS]
            if kept is None:
                return Claim(seq, None)
            if "unknown" in kept:
                return Claim(seq, None, str(kept["unknown"]))
            entry = Entry.from_json(kept)
        else:  # a row from before sets: its previous model is a reference
            prev = row.previous
            if prev.name != spec.model or prev.version is None:
                return Claim(seq, None)
            found = self.catalogue.find(prev.name, prev.version, prev.artifact_id, target)
            if found is None:
                return Claim(seq, None, f"{prev.name} v{prev.version}")
            entry = found
        return Claim(seq, Entry(entry.ref, entry.deployment_id, entry.urls, allow_downgrade=True))

    def for_send(self, spec: RolloutSpec, row: RolloutDevice, device: DeviceRecord | None,
                 rollout_id: str | None = None) -> tuple[DeviceSet, Claim]:
        """The set with ``row``'s package in it, and what its model was before (kept in the row at its first send)."""
        base = self.current(device, row.device_id, row)
        before = base.get(spec.model)
        previous = Claim(0, before, base.unknown.get(spec.model, ""))
        return base.put(self.wanted(spec, row, rollout_id)), previous

    def for_revert(self, spec: RolloutSpec, row: RolloutDevice, device: DeviceRecord | None) -> DeviceSet:
        """The set with ``row``'s model put back to what it was before the row's first send."""
        target = device.birth.target if device is not None and device.birth is not None else None
        base = self.current(device, row.device_id, row)
        back = self.previous(spec, row, target)
        if back.entry is not None:
            return base.put(back.entry)
        dropped = base.drop(spec.model)
        if back.unknown:
            return DeviceSet(dropped.device_id, dropped.entries, {**dropped.unknown, spec.model: back.unknown})
        return dropped


def revert_message(composer: Composer, spec: RolloutSpec, rollout_id: str, row: RolloutDevice) -> SetMessage:
    """What a device gets when ``row``'s rollout no longer wants its package there (a halt, an abort, a rollback).

    An agent that speaks schema 2 gets its set with the row's model put back; any other agent (or
    a set that cannot name what the device ran before) gets "keep what you have": the rollback
    command, sent beside it, is what puts the model back there."""
    device = composer.store.device(row.device_id)
    back = composer.for_revert(spec, row, device)
    if schema_for(device.birth if device is not None else None, back) != 2:
        return SetMessage.keep(row.device_id, rollout_id)
    return SetMessage(row.device_id, rollout_id, 2, (*back.models, *back.pipelines))


def previous_json(claim: Claim) -> dict[str, object] | None:
    """How a row keeps what its model was before its first send."""
    if claim.entry is not None:
        return claim.entry.to_json()
    return {"unknown": claim.unknown} if claim.unknown else None


def _kept_id(reported: str | None, fallback: str) -> str:
    """The deployment id a device reports for a model it runs, when it is a valid id; else the rollout that kept it."""
    try:
        return validate_id(reported or "", "deployment id")
    except ProtocolError:
        return fallback
