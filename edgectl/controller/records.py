"""The controller's records: statuses as string enums, the rollout spec, the device record and the rows the store keeps.

Statuses are stored under their values (``"rolling-back"``): never rename a value, existing stores
hold it. :class:`RolloutSpec` is what ``edgectl deploy --fleet`` asked for, frozen once recorded;
``to_dict``/``from_dict`` are the store's JSON, and ``from_dict`` reads specs written before a key
existed (the key's default applies) and ignores keys it does not know.
"""

from __future__ import annotations

import enum
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from edgecore.errors import ProtocolError
from edgecore.protocol.reports import Birth, DeviceState, Presence, RunningModel, Telemetry

__all__ = [
    "ACTIVE",
    "COUNTED_FAILED",
    "FINAL",
    "FINISHED",
    "IN_FLIGHT",
    "PENDING",
    "UNSENT",
    "AuditEntry",
    "DeviceEventRow",
    "DeviceRecord",
    "DeviceStatus",
    "LatencyPoint",
    "ModelRef",
    "PackageRef",
    "Phase",
    "RolloutDevice",
    "RolloutRow",
    "RolloutSpec",
    "RolloutStatus",
    "served_models",
]

log = logging.getLogger(__name__)


class _Label(str, enum.Enum):
    """A status whose ``str()`` and ``format()`` are its stored value on every Python version."""

    def __str__(self) -> str:
        return str(self.value)


class RolloutStatus(_Label):
    """Where a rollout stands; :mod:`edgectl.controller.lifecycle` holds its transitions."""

    SCHEDULED = "scheduled"  # approved (or needing no approval), waiting for its start time
    AWAITING_APPROVAL = "awaiting-approval"  # waiting for a second operator (two-person rule)
    RUNNING = "running"
    PAUSED = "paused"
    ROLLING_BACK = "rolling-back"
    ABORTING = "aborting"
    ROLLED_BACK = "rolled-back"
    ABORTED = "aborted"
    DONE = "done"
    REJECTED = "rejected"  # a second operator refused it before it started


class Phase(_Label):
    """The phase of the current wave; ``rollback`` after a halt or an abort."""

    START = "start"
    INSTALLING = "installing"
    BAKING = "baking"
    WAITING = "waiting"  # baked, but a gate has no data: waits for it until a deadline (Engine.data_deadline)
    ROLLBACK = "rollback"


class DeviceStatus(_Label):
    """One device's part in one rollout."""

    PLANNED = "planned"
    SKIPPED = "skipped"
    SENT = "sent"
    DEFERRED = "deferred"  # offline when its wave started: its retained desired state waits for it
    RUNNING = "running"
    OK = "ok"
    FAILED = "failed"
    ROLLBACK_SENT = "rollback-sent"
    ROLLED_BACK = "rolled-back"
    CANCELLED = "cancelled"
    SUPERSEDED = "superseded"
    REFUSED = "refused"  # the controller would not send it: the device's agent or memory cannot take the set


ACTIVE = (RolloutStatus.RUNNING, RolloutStatus.PAUSED, RolloutStatus.ROLLING_BACK, RolloutStatus.ABORTING)
FINAL = (RolloutStatus.DONE, RolloutStatus.ROLLED_BACK, RolloutStatus.ABORTED, RolloutStatus.REJECTED)
PENDING = (RolloutStatus.SCHEDULED, RolloutStatus.AWAITING_APPROVAL)  # recorded, nothing sent yet
IN_FLIGHT = (DeviceStatus.SENT, DeviceStatus.RUNNING)
UNSENT = (DeviceStatus.SKIPPED, DeviceStatus.PLANNED, DeviceStatus.CANCELLED, DeviceStatus.SUPERSEDED, DeviceStatus.REFUSED)
COUNTED_FAILED = (DeviceStatus.FAILED, DeviceStatus.ROLLED_BACK)
# A device's part that will not change again unless an operator retries it.
FINISHED = (DeviceStatus.OK, DeviceStatus.FAILED, DeviceStatus.ROLLED_BACK, DeviceStatus.CANCELLED, DeviceStatus.REFUSED)


@dataclass(frozen=True)
class PackageRef:
    """One variant of a rollout: the package kept next to the store, and what it installs.

    ``kind``: ``model`` or ``pipeline`` (its manifest's). ``weights``: the bytes of the files the
    device must hold in memory to serve it (roles ``model``, ``partition``, a pipeline's ``graph``),
    the lower bound of its footprint that admission counts before the device measured it; None in
    specs recorded before it was kept. ``needs``: the models a pipeline's steps run."""

    variant: str  # sha256 of the signed manifest
    artifact_id: str
    name: str
    version: int
    target: str
    label: str
    path: str
    size: int
    kind: str = "model"
    weights: int | None = None
    needs: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"variant": self.variant, "artifact_id": self.artifact_id, "name": self.name, "version": self.version,
                "target": self.target, "label": self.label, "path": self.path, "size": self.size, "kind": self.kind,
                "weights": self.weights, "needs": list(self.needs)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PackageRef:
        weights = d.get("weights")
        return cls(str(d["variant"]), str(d["artifact_id"]), str(d["name"]), int(d["version"]), str(d.get("target", "any")),
                   str(d.get("label", d["name"])), str(d["path"]), int(d.get("size", 0)), str(d.get("kind", "model")),
                   None if weights is None else int(weights), tuple(str(n) for n in d.get("needs") or ()))


@dataclass(frozen=True)
class RolloutSpec:
    """What the operator asked for: packages, waves, gates, timeouts and options."""

    selector: str
    packages: tuple[PackageRef, ...]
    wave_count: int
    max_failure: float  # fraction of a wave's devices
    bake_s: float
    gates: tuple[str, ...]  # gate expressions, defaults included (failure_rate, silence)
    silence_s: float
    shadow: bool = False
    allow_downgrade: bool = False
    wave_timeout_s: float = 600.0
    max_per_minute: int = 0  # desired states sent per minute within a wave; 0: the whole wave at once
    artifact_urls: tuple[str, ...] = ()  # where devices may fetch payloads by HTTP(S) ({artifact_id} filled in)
    allow_no_data: bool = False  # --allow-no-data: a gate without data does not hold a baked wave
    start_at: float | None = None  # --start-at: the engine starts it then, by the store's clock (None: at once)
    approval: str = ""  # why it waits for a second operator's approval ("": it needs none)
    created_by: str = ""  # who recorded it: the one operator who may not approve it
    deadline: float | None = None  # --deadline: from then on maintenance windows hold no device back (forced update)

    @property
    def model(self) -> str:
        """The name of the one model (or pipeline) this rollout moves: every package is a variant of it."""
        return self.packages[0].name if self.packages else ""

    @property
    def kind(self) -> str:
        """``model`` or ``pipeline``: what this rollout moves."""
        return self.packages[0].kind if self.packages else "model"

    def package(self, variant: str) -> PackageRef:
        """The entry for one variant; KeyError for a variant this rollout does not carry."""
        for package in self.packages:
            if package.variant == variant:
                return package
        raise KeyError(variant)

    def to_dict(self) -> dict[str, Any]:
        return {"selector": self.selector, "packages": [p.to_dict() for p in self.packages], "wave_count": self.wave_count,
                "max_failure": self.max_failure, "bake_s": self.bake_s, "gates": list(self.gates), "silence_s": self.silence_s,
                "shadow": self.shadow, "allow_downgrade": self.allow_downgrade, "wave_timeout_s": self.wave_timeout_s,
                "max_per_minute": self.max_per_minute, "artifact_urls": list(self.artifact_urls),
                "allow_no_data": self.allow_no_data, "start_at": self.start_at, "approval": self.approval,
                "created_by": self.created_by, "deadline": self.deadline}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RolloutSpec:
        return cls(
            selector=str(d.get("selector", "all")), packages=tuple(PackageRef.from_dict(p) for p in d.get("packages") or ()),
            wave_count=int(d.get("wave_count", 0)), max_failure=float(d.get("max_failure", 0.05)),
            bake_s=float(d.get("bake_s", 0.0)), gates=tuple(str(g) for g in d.get("gates") or ()),
            silence_s=float(d.get("silence_s", 60.0)), shadow=bool(d.get("shadow", False)),
            allow_downgrade=bool(d.get("allow_downgrade", False)), wave_timeout_s=float(d.get("wave_timeout_s", 600.0)),
            max_per_minute=int(d.get("max_per_minute", 0)),
            artifact_urls=tuple(str(u) for u in d.get("artifact_urls") or ()),
            allow_no_data=bool(d.get("allow_no_data", False)),
            start_at=None if d.get("start_at") is None else float(d["start_at"]), approval=str(d.get("approval") or ""),
            created_by=str(d.get("created_by") or ""), deadline=None if d.get("deadline") is None else float(d["deadline"]),
        )


def served_models(state: DeviceState | None) -> tuple[RunningModel, ...]:
    """Every model and pipeline a device's state lists; a state built with only ``active`` (``models`` left empty,
    as light agents and code from before sets write it) serves that one model."""
    if state is None:
        return ()
    return state.models or ((state.active,) if state.active is not None else ())


@dataclass(frozen=True)
class ModelRef:
    """The model a device ran before a rollout reached it (from its retained state)."""

    name: str | None = None
    version: int | None = None
    artifact_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "artifact_id": self.artifact_id}

    @classmethod
    def of(cls, active: RunningModel | None) -> ModelRef:
        """The reference of what a device's state says it serves (all None when it serves nothing)."""
        return cls() if active is None else cls(active.name, active.version, active.artifact_id)

    @classmethod
    def named(cls, state: DeviceState | None, name: str) -> ModelRef:
        """The reference of the model (or pipeline) called ``name`` that a device's state lists (all None: none)."""
        return cls.of(next((m for m in served_models(state) if m.name == name), None))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelRef:
        version = d.get("version")
        return cls(d.get("name"), int(version) if isinstance(version, (int, str)) and str(version).isdigit() else None,
                   d.get("artifact_id"))


@dataclass(frozen=True)
class DeviceRecord:
    """What the controller knows of one device: its presence and its latest birth, state and telemetry reports.

    The store keeps one per device; ``edgectl devices`` also gathers them from the broker's retained
    reports (:func:`edgectl.controller.ingest.collect_devices`). ``to_dict`` is the listing row of the
    CLI, the REST API and selectors."""

    id: str
    online: bool | None = None
    last_seen: float | None = None
    birth: Birth | None = None
    state: DeviceState | None = None
    telemetry: Telemetry | None = None
    telemetry_ts: float | None = None  # when the controller stored the latest telemetry report
    decommissioned: float | None = None  # when an operator took it out of the fleet (edgectl.fleet.lifecycle)

    @property
    def status(self) -> str:
        return "online" if self.online else "offline" if self.online is False else "unknown"

    @property
    def active(self) -> RunningModel | None:
        """The model the device's state says it serves."""
        return None if self.state is None else self.state.active

    @property
    def models(self) -> tuple[RunningModel, ...]:
        """Every model and pipeline the device's state says it serves."""
        return served_models(self.state)

    def served(self, name: str) -> RunningModel | None:
        """The model or pipeline called ``name`` that the device serves."""
        return next((m for m in self.models if m.name == name), None)

    @property
    def last_seq(self) -> int:
        """The last controller sequence number the device's state says it accepted (0: none, or no state)."""
        return 0 if self.state is None else self.state.last_seq

    def observed(self, report: Birth | Presence | DeviceState) -> DeviceRecord:
        """This record after one of the device's retained reports; ``last_seen`` is the newest report time."""
        if isinstance(report, Presence):
            return replace(self, online=report.online, last_seen=max(self.last_seen or 0.0, report.ts))
        seen = max(self.last_seen or 0.0, report.ts or 0.0)
        if isinstance(report, Birth):
            return replace(self, birth=report, last_seen=seen)
        return replace(self, state=report, last_seen=seen)

    def to_dict(self) -> dict[str, Any]:
        birth, active = self.birth or Birth(self.id), self.active
        deployment = None if self.state is None or self.state.deployment is None else self.state.deployment.to_json()
        return {
            "device_id": self.id, "status": self.status, "agent_version": birth.agent_version, "target": birth.target,
            "tags": birth.tags, "model": active.name if active else None, "version": active.version if active else None,
            "backend": active.backend if active else None, "models": self.model_rows(), "deployment": deployment,
            "inference_url": birth.inference_url, "last_seen": self.last_seen, "last_telemetry": self.telemetry_ts,
            "desired_schemas": list(birth.desired_schemas),
            "memory_budget_mb": None if self.state is None else self.state.memory_budget_mb,
            "decommissioned": self.decommissioned,
        }

    def model_rows(self) -> list[dict[str, Any]]:
        """Every model and pipeline served, with its figures from the latest telemetry when it is of that version."""
        rows = []
        for m in self.models:
            stats = self.telemetry.models.get(m.name) if self.telemetry is not None else None
            if stats is not None and stats.version != str(m.version):
                stats = None  # the telemetry came before the state changed: its figures are another version's
            footprint = m.footprint_mb if m.footprint_mb is not None else stats.footprint_mb if stats else None
            rows.append({"name": m.name, "kind": m.kind, "version": m.version, "backend": m.backend or (stats.backend if stats
                         else None), "deployment_id": m.deployment_id, "footprint_mb": footprint,
                         "p50_ms": stats.latency_ms.p50 if stats else None, "p95_ms": stats.latency_ms.p95 if stats else None,
                         "requests": stats.requests if stats else None, "errors": stats.errors if stats else None,
                         "throughput_rps": stats.throughput_rps if stats else None})
        return rows

    @classmethod
    def from_columns(cls, device_id: str, online: int | None, last_seen: float | None, birth: str | None,
                     state: str | None, telemetry: str | None, telemetry_ts: float | None,
                     decommissioned: float | None = None) -> DeviceRecord:
        """A record from the store's row: the reports are kept as their JSON text."""
        return cls(device_id, None if online is None else bool(online), last_seen, _stored(device_id, Birth.from_json, birth),
                   _stored(device_id, DeviceState.from_json, state), _stored(device_id, Telemetry.from_json, telemetry),
                   telemetry_ts, decommissioned)


R = TypeVar("R", Birth, DeviceState, Telemetry)


def _stored(device_id: str, read: Callable[[Any], R], text: str | None) -> R | None:
    """A report kept as JSON text; one that no longer reads (kept before reports were typed) is left out, said once."""
    if not text or text == "{}":
        return None
    try:
        return read(json.loads(text))
    except (ProtocolError, ValueError) as exc:
        if (device_id, read) not in _UNREADABLE:
            _UNREADABLE.add((device_id, read))
            log.warning("device %s: a kept report does not read (%s); its next report replaces it", device_id, exc)
        return None


_UNREADABLE: set[tuple[str, object]] = set()


@dataclass
class RolloutRow:
    """One rollout: its spec and where it stands. Change ``status`` through the lifecycle table only."""

    id: str
    created: float
    status: RolloutStatus
    spec: RolloutSpec
    wave: int = 0
    phase: Phase = Phase.START
    phase_since: float = 0.0
    reason: str = ""
    updated: float = 0.0


@dataclass
class RolloutDevice:
    """One device's part in a rollout; ``data`` merges what its events reported (backend, shadow, ...)."""

    rollout_id: str
    device_id: str
    wave: int  # 1-based; 0 when skipped
    variant: str  # variant id of the package this device gets ("" when skipped)
    status: DeviceStatus
    state: str = ""
    detail: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    desired: bytes | None = None
    previous: ModelRef = field(default_factory=ModelRef)
    installed_at: float | None = None
    updated: float = 0.0

    @property
    def rollback_due(self) -> bool:
        """A rollback command the broker never acknowledged, or sent before the device reconnected."""
        return bool(self.data.get("rollback_due"))

    @rollback_due.setter
    def rollback_due(self, due: bool) -> None:
        self.data["rollback_due"] = due

    @property
    def shadow_agreement(self) -> float | None:
        """The agreement the device's shadow run reported (event data ``shadow.agreement``), if any."""
        shadow = self.data.get("shadow")
        value = shadow.get("agreement") if isinstance(shadow, dict) else None
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class LatencyPoint:
    """One p95 latency figure of one model version on one device: from telemetry or a health check."""

    device_id: str
    ts: float
    model: str
    version: int
    p95_ms: float
    source: str  # "telemetry" | "health"

    def to_dict(self) -> dict[str, Any]:
        return {"device_id": self.device_id, "ts": self.ts, "model": self.model, "version": self.version,
                "p95_ms": self.p95_ms, "source": self.source}


@dataclass(frozen=True)
class DeviceEventRow:
    """A deployment event as a device reported it."""

    device_id: str
    ts: float
    deployment_id: str
    state: str
    status: str
    detail: str
    data: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"device_id": self.device_id, "ts": self.ts, "deployment_id": self.deployment_id, "state": self.state,
                "status": self.status, "detail": self.detail, "data": self.data}


@dataclass(frozen=True)
class AuditEntry:
    """One line of the audit log: an operator action, a controller decision or a device transition."""

    id: int
    ts: float
    actor: str
    rollout_id: str
    device_id: str
    action: str
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "ts": self.ts, "actor": self.actor, "rollout_id": self.rollout_id,
                "device_id": self.device_id, "action": self.action, "detail": self.detail}
