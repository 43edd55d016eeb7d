"""The deployment record: what a deployment needs to resume after a restart, saved as ``deployment.json``.

Typed in memory, plain JSON on disk. A deployment installs one *unit*: a model alone, or a
pipeline with the models its steps run, which switch together (docs/runtime.md, Many models).
Each model or pipeline of the unit is a :class:`Part` with its own manifest, deployment id,
options and findings. The saved names are stable (an older agent's record must still load): the
record carries ``"schema": 2``; a schema 1 record (one model, from before sets) reads as a unit of
one part. Per part, the desired state's options and what the states learned share one ``"data"``
object under the keys of :class:`Options` and :class:`Findings`. A record that cannot be read
(missing keys, wrong types) is ``None``: nothing to resume.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgecore.durable import read_json
from edgecore.errors import EdgeError
from edgecore.protocol.manifest import Manifest
from edgecore.windows import Maintenance

__all__ = ["RECORD_SCHEMA", "Deployment", "Findings", "Options", "Outcome", "Part", "State"]

RECORD_SCHEMA = 2  # 1: one model, its fields at the top level


class State(str, enum.Enum):
    """States under their saved names: never rename a value, old agents' files use it."""

    DOWNLOAD = "download"
    VERIFY = "verify"
    STAGE = "stage"
    SHADOW = "shadow"
    ACTIVATE = "activate"
    HEALTH = "health"
    COMMIT = "commit"
    ROLLBACK = "rollback"
    FAILURE = "failure"
    DONE = "done"


class Outcome(str, enum.Enum):
    """How a deployment ended, as reported in its terminal event's status."""

    OK = "ok"
    ROLLED_BACK = "rolled-back"
    FAILED = "failed"


@dataclass(frozen=True)
class Options:
    """What the desired state asked of this deployment."""

    allow_downgrade: bool = False
    shadow_min: float | None = None  # the agreement a shadow run must reach; None: no shadow run
    maintenance: Maintenance | None = None  # when it may install (agent.deploy.window); None: at once

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"allow_downgrade": self.allow_downgrade, "shadow_min": self.shadow_min}
        if self.maintenance:  # records and jobs written without windows read as before
            data["maintenance"] = self.maintenance.to_json()
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Options:
        shadow_min, maintenance = data.get("shadow_min"), data.get("maintenance")
        return cls(_typed(data, "allow_downgrade", bool, False), None if shadow_min is None else _number(shadow_min),
                   None if maintenance is None else Maintenance.from_json(maintenance))


@dataclass(frozen=True)
class Findings:
    """What the states learned so far; each state adds its part with :meth:`Deployment.learn`."""

    slot: str | None = None  # the slot the payload was unpacked into (VERIFY)
    stage: str | None = None  # staging's one-line verdict (STAGE)
    shadow: Mapping[str, Any] | None = None  # the shadow run's figures (SHADOW), as agent.shadow reports them
    backend: str | None = None  # the backend chosen by measurement (ACTIVATE)
    selection: Mapping[str, Any] | None = None  # the whole selection, as agent.selection reports it (ACTIVATE)
    health_p95_ms: float | None = None  # (HEALTH)
    footprints: Mapping[str, float] | None = None  # resident MiB per backend measured (STAGE, ACTIVATE)

    def to_dict(self) -> dict[str, Any]:
        """The findings made so far (absent keys: not made yet)."""
        return {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in dataclasses.asdict(self).items() if v is not None}

    def report(self) -> dict[str, Any]:
        """The findings that go into the device's events."""
        return {k: v for k, v in self.to_dict().items() if k in ("backend", "health_p95_ms", "stage", "shadow", "footprints")}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Findings:
        health = data.get("health_p95_ms")
        return cls(
            slot=_typed(data, "slot", str, None), stage=_typed(data, "stage", str, None),
            shadow=_typed(data, "shadow", dict, None), backend=_typed(data, "backend", str, None),
            selection=_typed(data, "selection", dict, None), health_p95_ms=None if health is None else _number(health),
            footprints=_footprints(data.get("footprints")),
        )


@dataclass
class Part:
    """One model or pipeline of a deployment's unit: its signed manifest, the deployment that asked for it, options
    and findings."""

    deployment_id: str
    manifest_bytes: bytes
    options: Options = field(default_factory=Options)
    findings: Findings = field(default_factory=Findings)

    @functools.cached_property
    def manifest(self) -> Manifest:
        return Manifest.from_bytes(self.manifest_bytes)

    @property
    def name(self) -> str:
        return self.manifest.name

    def learn(self, **findings: Any) -> None:
        """Record what a state found out (``slot=...``, ``backend=...``)."""
        self.findings = dataclasses.replace(self.findings, **findings)

    def to_dict(self) -> dict[str, Any]:
        return {"deployment_id": self.deployment_id, "manifest": base64.b64encode(self.manifest_bytes).decode(),
                "data": {**self.options.to_dict(), **self.findings.to_dict()}}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Part:
        data = raw.get("data", {})
        if not isinstance(data, dict):
            raise TypeError("data")
        return cls(str(raw["deployment_id"]), base64.b64decode(raw["manifest"]), Options.from_dict(data),
                   Findings.from_dict(data))


@dataclass
class Deployment:
    """One deployment's progress: the machine moves ``state``; handlers set ``reason``, ``outcome`` and each part's
    findings. A unit of one model is the common case (:meth:`single`)."""

    parts: list[Part]
    state: State = State.DOWNLOAD
    entries: dict[str, int] = field(default_factory=dict)  # times each state was entered (crash-loop guard)
    reason: str = ""
    outcome: Outcome | None = None  # set by the terminal states
    ticket: int = 0  # its place in the work queue (agent.deploy.jobs), 0 for records older than the queue
    reported: bool = False  # its final event was handed to the transport (records older than the flag: True)

    @classmethod
    def single(cls, deployment_id: str, manifest_bytes: bytes, options: Options = Options(), **fields: Any) -> Deployment:
        return cls([Part(deployment_id, manifest_bytes, options)], **fields)

    @property
    def deployment_id(self) -> str:
        """The unit's id in logs: its first part's."""
        return self.parts[0].deployment_id

    @property
    def unit(self) -> str:
        """The names the unit installs, for messages: ``detector+recognizer+ocr``."""
        return "+".join(part.name for part in self.parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": RECORD_SCHEMA, "state": self.state.value, "entries": self.entries, "reason": self.reason,
            "outcome": self.outcome.value if self.outcome else "", "ticket": self.ticket, "reported": self.reported,
            "parts": [part.to_dict() for part in self.parts],
        }

    @classmethod
    def from_dict(cls, raw: Any, recovery: Mapping[State, State]) -> Deployment | None:
        """Read a saved record; its state maps through ``recovery`` (unknown means ROLLBACK); unreadable is None."""
        if not isinstance(raw, dict) or raw.get("schema") not in (1, RECORD_SCHEMA):
            return None
        try:
            state = recovery.get(State(raw["state"]), State.ROLLBACK)
        except (ValueError, KeyError):
            state = State.ROLLBACK
        try:
            parts = [_part_of_schema_1(raw)] if raw["schema"] == 1 else [Part.from_dict(p) for p in raw["parts"]]
            if not parts:
                raise ValueError("no parts")
            return cls(
                parts=parts, state=state, entries={str(k): int(v) for k, v in dict(raw.get("entries", {})).items()},
                reason=str(raw.get("reason", "")), outcome=Outcome(raw["outcome"]) if raw.get("outcome") else None,
                ticket=int(raw.get("ticket", 0)), reported=_typed(raw, "reported", bool, True),
            )
        except (KeyError, TypeError, ValueError, AttributeError, EdgeError):  # EdgeError: a manifest that does not read
            return None

    @classmethod
    def load(cls, path: Path, recovery: Mapping[State, State]) -> Deployment | None:
        return cls.from_dict(read_json(path), recovery)


def _part_of_schema_1(raw: Mapping[str, Any]) -> Part:
    """A record from before sets: one model, its slot ``a`` or ``b`` now ``<name>/a`` (agent.deploy.slots moved it)."""
    part = Part.from_dict(raw)
    slot = part.findings.slot
    if slot is not None and "/" not in slot:
        part.learn(slot=f"{part.name}/{slot}")
    return part


def _footprints(value: Any) -> dict[str, float] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise TypeError("footprints: expected an object")
    return {str(k): _number(v) for k, v in value.items()}


def _typed(data: Mapping[str, Any], key: str, kind: type, default: Any) -> Any:
    value = data.get(key, default)
    if value is not None and not isinstance(value, kind):
        raise TypeError(f"{key}: expected {kind.__name__}, got {type(value).__name__}")
    return value


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected a number, got {type(value).__name__}")
    return float(value)
