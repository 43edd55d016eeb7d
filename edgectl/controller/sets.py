"""A device's set as the controller composes it: every model and pipeline it should run, and how it is sent.

One rollout moves one model (or one pipeline); a device may be in several rollouts of different
models at once. What the device should run is therefore composed per device
(:mod:`edgectl.controller.composition`): one :class:`Entry` per name, each naming the kept package
(:class:`~edgectl.controller.records.PackageRef`) and the deployment that put it there. The whole set
is signed under one sequence number (:func:`sign`), as schema 2 (docs/protocol.md, Desired state,
schema 2), or as schema 1 for an agent whose birth does not list schema 2: such an agent takes a
set of one model, and is refused (:func:`schema_for`) a set with more, or any pipeline.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgecore.protocol.envelope import DESIRED_TYPE, Envelope, sign
from edgecore.protocol.messages import DeployOptions, DesiredModel, DesiredSet, DesiredState
from edgecore.protocol.reports import Birth
from edgecore.windows import Maintenance
from edgectl.controller.records import PackageRef
from edgectl.package import Package
from edgectl.sequence import next_sequence

__all__ = ["DESIRED_VALIDITY_S", "DeviceSet", "Entry", "SetMessage", "desired_seq", "schema_for", "sign_message"]

DESIRED_VALIDITY_S = 7 * 86400


@dataclass(frozen=True)
class Entry:
    """One model or pipeline of a device's set: the kept package, the deployment that put it there, its options."""

    ref: PackageRef
    deployment_id: str
    urls: tuple[str, ...] = ()
    allow_downgrade: bool = False
    shadow_min: float | None = None
    maintenance: Maintenance | None = None  # when the device may install it (controller.maintenance); None: at once

    @property
    def name(self) -> str:
        return self.ref.name

    @property
    def kind(self) -> str:
        return self.ref.kind

    def label(self) -> str:
        return f"{self.ref.name} v{self.ref.version}"

    def to_json(self) -> dict[str, object]:
        """How a row keeps it (``previous`` of a rollout row) and the API shows it."""
        return {"ref": self.ref.to_dict(), "deployment_id": self.deployment_id, "urls": list(self.urls),
                "allow_downgrade": self.allow_downgrade, "shadow_min": self.shadow_min,
                "maintenance": self.maintenance.to_json() if self.maintenance else None}

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> Entry:
        ref = data["ref"]
        shadow = data.get("shadow_min")
        urls = data.get("urls") or []
        assert isinstance(ref, dict) and isinstance(urls, list)
        maintenance = data.get("maintenance")
        return cls(PackageRef.from_dict(ref), str(data["deployment_id"]), tuple(str(u) for u in urls),
                   bool(data.get("allow_downgrade", False)), None if not isinstance(shadow, (int, float)) else float(shadow),
                   None if maintenance is None else Maintenance.from_json(maintenance))


@dataclass(frozen=True)
class DeviceSet:
    """What one device should run, by name; ``unknown``: models it runs that no kept package names.

    A set with unknown models cannot be sent as schema 2: it would have to leave them out, and the
    device would remove them."""

    device_id: str
    entries: Mapping[str, Entry] = field(default_factory=dict)
    unknown: Mapping[str, str] = field(default_factory=dict)  # name -> "name vN" the device runs and no package names

    def get(self, name: str) -> Entry | None:
        return self.entries.get(name)

    def put(self, entry: Entry) -> DeviceSet:
        return DeviceSet(self.device_id, {**self.entries, entry.name: entry},
                         {k: v for k, v in self.unknown.items() if k != entry.name})

    def drop(self, name: str) -> DeviceSet:
        return DeviceSet(self.device_id, {k: e for k, e in self.entries.items() if k != name},
                         {k: v for k, v in self.unknown.items() if k != name})

    @property
    def models(self) -> tuple[Entry, ...]:
        return tuple(e for _, e in sorted(self.entries.items()) if e.kind != "pipeline")

    @property
    def pipelines(self) -> tuple[Entry, ...]:
        return tuple(e for _, e in sorted(self.entries.items()) if e.kind == "pipeline")

    def names(self) -> str:
        return ", ".join([*(e.label() for _, e in sorted(self.entries.items())), *self.unknown.values()]) or "nothing"


@dataclass(frozen=True)
class SetMessage:
    """A set ready to sign for one device: ``schema`` 2 (the set), or 1 (its one model, or none: keep what you have)."""

    device_id: str
    deployment_id: str  # the change of the set: the rollout that makes it
    schema: int
    entries: tuple[Entry, ...] = ()

    @classmethod
    def keep(cls, device_id: str, deployment_id: str) -> SetMessage:
        """Schema 1 ``model: null``: keep what you have (every agent takes it)."""
        return cls(device_id, deployment_id, 1)


def schema_for(birth: Birth | None, device_set: DeviceSet) -> int | str:
    """The desired-state schema to send ``device_set`` in, or why it cannot be sent to this agent.

    An agent whose birth does not list schema 2 (agents from before sets send none: ``[1]``) takes
    one model in schema 1; a set with more models, or a pipeline, is refused with that reason. A
    set with models the controller cannot name is refused to every agent: sending it would remove them."""
    speaks = birth.desired_schemas if birth is not None else (1,)
    if device_set.unknown:
        return (f"it runs {', '.join(device_set.unknown.values())}, which no package this controller keeps names: a set without "
                "it would remove it (roll it out through the controller first)")
    if 2 in speaks:
        return 2
    if len(device_set.models) > 1 or device_set.pipelines:
        return (f"its agent takes desired-state schema {', '.join(map(str, speaks))} only (its birth does not list 2), "
                f"which holds one model; the set would be {device_set.names()}: upgrade the agent to run several models")
    return 1


def sign_message(key: Ed25519PrivateKey, message: SetMessage, package: Callable[[PackageRef], Package],
                 now: float | None = None) -> bytes:
    """The signed desired state of ``message`` (a fresh sequence number); ``package`` reads a kept package."""
    issued = time.time() if now is None else now
    seq, expires = next_sequence(), issued + DESIRED_VALIDITY_S
    if message.schema == 2:
        models = tuple(_desired(e, package(e.ref)) for e in message.entries if e.kind != "pipeline")
        pipelines = tuple(_desired(e, package(e.ref)) for e in message.entries if e.kind == "pipeline")
        payload = DesiredSet(message.device_id, seq, issued, expires, message.deployment_id, models, pipelines).to_payload()
    else:
        entry = message.entries[0] if message.entries else None
        model = None if entry is None else _desired(entry, package(entry.ref))
        options = {} if entry is None else DeployOptions(entry.allow_downgrade, entry.shadow_min, entry.maintenance).to_json()
        payload = DesiredState(message.device_id, seq, issued, expires, entry.deployment_id if entry else message.deployment_id,
                               None if model is None else DesiredModel(model.name, model.version, model.manifest, model.urls),
                               options or {"allow_downgrade": False}).to_payload()
    return sign(DESIRED_TYPE, payload, key).to_bytes()


def desired_seq(payload: bytes) -> int:
    """The sequence number inside a signed desired state (parsed, not verified: we signed it)."""
    return int(json.loads(Envelope.from_bytes(payload).payload)["seq"])


def _desired(entry: Entry, package: Package) -> DesiredModel:
    m = package.manifest
    return DesiredModel(m.name, m.version, package.envelope, entry.urls, entry.deployment_id,
                        DeployOptions(entry.allow_downgrade, entry.shadow_min, entry.maintenance))
