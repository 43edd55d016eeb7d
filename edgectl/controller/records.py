"""The controller's records: statuses as string enums, the rollout spec and the rows the store keeps.

Statuses are stored under their values (``"rolling-back"``): never rename a value, existing stores
hold it. :class:`RolloutSpec` is what ``edgectl deploy --fleet`` asked for, frozen once recorded;
``to_dict``/``from_dict`` are the store's JSON, and ``from_dict`` reads specs written before a key
existed (the key's default applies) and ignores keys it does not know.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ACTIVE",
    "COUNTED_FAILED",
    "FINAL",
    "FINISHED",
    "IN_FLIGHT",
    "UNSENT",
    "AuditEntry",
    "DeviceEventRow",
    "DeviceRow",
    "DeviceStatus",
    "LatencyPoint",
    "ModelRef",
    "PackageRef",
    "Phase",
    "RolloutDevice",
    "RolloutRow",
    "RolloutSpec",
    "RolloutStatus",
]


class _Label(str, enum.Enum):
    """A status whose ``str()`` and ``format()`` are its stored value on every Python version."""

    def __str__(self) -> str:
        return str(self.value)


class RolloutStatus(_Label):
    """Where a rollout stands; :mod:`edgectl.controller.lifecycle` holds its transitions."""

    RUNNING = "running"
    PAUSED = "paused"
    ROLLING_BACK = "rolling-back"
    ABORTING = "aborting"
    ROLLED_BACK = "rolled-back"
    ABORTED = "aborted"
    DONE = "done"


class Phase(_Label):
    """The phase of the current wave; ``rollback`` after a halt or an abort."""

    START = "start"
    INSTALLING = "installing"
    BAKING = "baking"
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


ACTIVE = (RolloutStatus.RUNNING, RolloutStatus.PAUSED, RolloutStatus.ROLLING_BACK, RolloutStatus.ABORTING)
FINAL = (RolloutStatus.DONE, RolloutStatus.ROLLED_BACK, RolloutStatus.ABORTED)
IN_FLIGHT = (DeviceStatus.SENT, DeviceStatus.RUNNING)
UNSENT = (DeviceStatus.SKIPPED, DeviceStatus.PLANNED, DeviceStatus.CANCELLED, DeviceStatus.SUPERSEDED)
COUNTED_FAILED = (DeviceStatus.FAILED, DeviceStatus.ROLLED_BACK)
# A device's part that will not change again unless an operator retries it.
FINISHED = (DeviceStatus.OK, DeviceStatus.FAILED, DeviceStatus.ROLLED_BACK, DeviceStatus.CANCELLED)


@dataclass(frozen=True)
class PackageRef:
    """One variant of a rollout: the package kept next to the store, and what it installs."""

    variant: str  # sha256 of the signed manifest
    artifact_id: str
    name: str
    version: int
    target: str
    label: str
    path: str
    size: int

    def to_dict(self) -> dict[str, Any]:
        return {"variant": self.variant, "artifact_id": self.artifact_id, "name": self.name, "version": self.version,
                "target": self.target, "label": self.label, "path": self.path, "size": self.size}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PackageRef:
        return cls(str(d["variant"]), str(d["artifact_id"]), str(d["name"]), int(d["version"]), str(d.get("target", "any")),
                   str(d.get("label", d["name"])), str(d["path"]), int(d.get("size", 0)))


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
                "max_per_minute": self.max_per_minute, "artifact_urls": list(self.artifact_urls)}

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
        )


@dataclass(frozen=True)
class ModelRef:
    """The model a device ran before a rollout reached it (from its retained state)."""

    name: str | None = None
    version: int | None = None
    artifact_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "artifact_id": self.artifact_id}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelRef:
        version = d.get("version")
        return cls(d.get("name"), int(version) if isinstance(version, (int, str)) and str(version).isdigit() else None,
                   d.get("artifact_id"))


@dataclass
class DeviceRow:
    """What the controller knows of one device from its retained messages and telemetry."""

    id: str
    online: bool | None = None
    last_seen: float | None = None
    birth: dict[str, Any] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)
    telemetry: dict[str, Any] = field(default_factory=dict)
    telemetry_ts: float | None = None


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
