"""Protocol v1 device reports: what a device publishes, one frozen class per topic, read on one path.

A report is a JSON object with ``"schema": 1`` that names the device it is about. The host reads
every report through :func:`read_report`, and only through it: the topic's leaf picks the class,
every field is validated, and a body that names another device than its topic is refused with
:class:`IdentityMismatch`. The topic is who sent it (the broker's ACL binds
``edge/v1/devices/<id>/...`` to the certificate whose CN is ``<id>``); the body only claims it.

Fields a device may leave out (agents that predate them, the light simulated agents) read as their
defaults; keys a reader does not know are ignored. What the host only shows and never reads (the
hardware summary, the backend selection, a model's placement and info) stays a JSON object. The
telemetry report's parts are in :mod:`edgecore.protocol.telemetry`, re-exported here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from edgecore.errors import ProtocolError, VerificationError
from edgecore.protocol import topics
from edgecore.protocol.device_config import ConfigStatus
from edgecore.protocol.logs import LogAnswer
from edgecore.protocol.schema import Fields, decode_json, encode_json
from edgecore.protocol.telemetry import DeviceMetrics, LatencyFigures, ModelTelemetry, StateDisk, Telemetry
from edgecore.protocol.topics import validate_id
from edgecore.windows import MAX_WINDOWS, WindowError, Windows

__all__ = [
    "Birth",
    "ChunkRequest",
    "DeploymentProgress",
    "DeviceEvent",
    "DeviceMetrics",
    "DeviceState",
    "IdentityMismatch",
    "LatencyFigures",
    "LogAnswer",
    "ModelTelemetry",
    "Presence",
    "Report",
    "RunningModel",
    "StateDisk",
    "Telemetry",
    "read_report",
]


class IdentityMismatch(VerificationError):
    """A report whose body names another device than the topic it came on."""


# -- device to controller ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Presence:
    """Online/offline marker (retained; the broker publishes the offline one as last will)."""

    LEAF: ClassVar[str] = "presence"
    QOS: ClassVar[int] = 1
    RETAIN: ClassVar[bool] = True

    device_id: str
    online: bool
    ts: float

    def to_payload(self) -> bytes:
        return encode_json({"device_id": self.device_id, "online": self.online, "ts": self.ts})

    @classmethod
    def from_payload(cls, raw: bytes) -> Presence:
        f = decode_json(raw, cls.LEAF)
        return cls(validate_id(f.text("device_id", 64)), f.boolean("online"), f.number("ts"))


@dataclass(frozen=True)
class Birth:
    """Who the device is, sent on every (re)connect (retained): agent version, target, tags, hardware."""

    LEAF: ClassVar[str] = "birth"
    QOS: ClassVar[int] = 1
    RETAIN: ClassVar[bool] = True

    device_id: str
    ts: float | None = None
    agent_version: str | None = None
    target: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    inference_url: str | None = None
    hardware: dict[str, Any] = field(default_factory=dict)  # the probe's summary, shown as it is
    runtimes: dict[str, str] = field(default_factory=dict)  # runtime name -> version
    profiles: dict[str, Any] = field(default_factory=dict)  # target profile -> can the runtimes run it (shown as it is)
    # The desired-state schemas the agent takes (edgecore.protocol.messages); absent: an agent from before sets, 1 only.
    desired_schemas: tuple[int, ...] = (1,)
    timezone: str | None = None  # the IANA zone its maintenance windows are read in; None: unknown (an older agent)
    maintenance_windows: tuple[str, ...] = ()  # its own windows (agent.yaml or its configuration) when it connected

    def speaks(self, schema: int) -> bool:
        """Whether the agent takes a desired state of this schema (2: a set of models and pipelines)."""
        return schema in self.desired_schemas

    def to_json(self) -> dict[str, Any]:
        return {"device_id": self.device_id, "ts": self.ts, "agent_version": self.agent_version, "target": self.target,
                "tags": self.tags, "inference_url": self.inference_url, "hardware": self.hardware, "runtimes": self.runtimes,
                "profiles": self.profiles, "desired_schemas": list(self.desired_schemas), "timezone": self.timezone,
                "maintenance_windows": list(self.maintenance_windows)}

    def to_payload(self) -> bytes:
        return encode_json(self.to_json())

    @classmethod
    def from_payload(cls, raw: bytes) -> Birth:
        return cls._read(decode_json(raw, cls.LEAF))

    @classmethod
    def from_json(cls, data: Any) -> Birth:
        return cls._read(Fields(data, cls.LEAF))

    @classmethod
    def _read(cls, f: Fields) -> Birth:
        return cls(validate_id(f.text("device_id", 64)), f.opt_number("ts"), f.opt_text("agent_version", 64),
                   f.opt_text("target", 64), f.entries("tags", Fields.text), f.opt_text("inference_url", 4096),
                   f.opt_raw_obj("hardware") or {}, f.entries("runtimes", Fields.text), f.opt_raw_obj("profiles") or {},
                   _schemas(f), f.opt_text("timezone", 64), _own_windows(f))


def _own_windows(f: Fields) -> tuple[str, ...]:
    """``maintenance_windows``: the device's own windows, each parsed as the agent parsed it; absent: none."""
    if f.data.get("maintenance_windows") is None:
        return ()
    try:
        return tuple(Windows.parse(f.array("maintenance_windows", MAX_WINDOWS), f"{f.what}.maintenance_windows").texts())
    except WindowError as exc:
        raise ProtocolError(str(exc)) from None


def _schemas(f: Fields) -> tuple[int, ...]:
    """``desired_schemas``: a list of schema numbers; absent means 1 only."""
    if f.data.get("desired_schemas") is None:
        return (1,)
    schemas = f.array("desired_schemas", 16)
    if not schemas or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in schemas):
        raise ProtocolError(f"{f.what}.desired_schemas: expected a list of schema numbers (integers from 1)")
    return tuple(schemas)


@dataclass(frozen=True)
class RunningModel:
    """A model (or pipeline) a device serves, as its state reports it.

    ``footprints``: the resident MiB the model took on each backend this device measured it on
    (staging's reference device, the serving backend); ``footprint_mb`` is the serving backend's,
    the figure the device's admission counts (docs/protocol.md, Admission)."""

    name: str
    version: int
    artifact_id: str | None = None
    backend: str | None = None
    slot: str | None = None
    kind: str = "model"  # or "pipeline"
    deployment_id: str | None = None  # the deployment that installed this version
    footprint_mb: float | None = None
    footprints: dict[str, float] = field(default_factory=dict)
    models: tuple[str, ...] = ()  # a pipeline's: the models its steps run

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "artifact_id": self.artifact_id, "backend": self.backend,
                "slot": self.slot, "kind": self.kind, "deployment_id": self.deployment_id,
                "footprint_mb": self.footprint_mb, "footprints": self.footprints, "models": list(self.models)}

    @classmethod
    def read(cls, f: Fields) -> RunningModel:
        kind = f.opt_text("kind", 16) or "model"
        if kind not in ("model", "pipeline"):
            raise ProtocolError(f"{f.what}.kind: {kind!r} is not model or pipeline")
        models = f.array("models", 64) if f.data.get("models") is not None else []
        if not all(isinstance(m, str) for m in models):
            raise ProtocolError(f"{f.what}.models: expected a list of model names")
        return cls(f.text("name", 128), f.integer("version"), f.opt_text("artifact_id", 64), f.opt_text("backend", 256),
                   f.opt_text("slot", 64), kind, f.opt_text("deployment_id", 64), f.opt_number("footprint_mb"),
                   f.entries("footprints", Fields.number), tuple(models))


@dataclass(frozen=True)
class DeploymentProgress:
    """The deployment a device is running, as its state reports it."""

    id: str
    state: str
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "state": self.state, "reason": self.reason}

    @classmethod
    def read(cls, f: Fields) -> DeploymentProgress:
        return cls(f.text("id", 64), f.text("state", 32), f.opt_text("reason", 4096) or "")


@dataclass(frozen=True)
class DeviceState:
    """What the device runs now (retained): every model and pipeline, the deployment under way, the last sequence.

    ``models`` lists everything served. ``active`` is there for readers that predate ``models``:
    the served model when it is the only one, else None. A state from an agent that predates
    ``models`` reads as the set of its ``active`` model. ``memory_budget_mb``: what the device's
    admission lets the set's footprints add up to (None: an agent that predates admission)."""

    LEAF: ClassVar[str] = "state"
    QOS: ClassVar[int] = 1
    RETAIN: ClassVar[bool] = True

    device_id: str
    ts: float | None = None
    active: RunningModel | None = None
    deployment: DeploymentProgress | None = None
    last_seq: int = 0
    models: tuple[RunningModel, ...] = ()
    memory_budget_mb: float | None = None
    config: ConfigStatus | None = None  # the newest device configuration handled (None: none yet, or an older agent)

    def to_json(self) -> dict[str, Any]:
        return {"device_id": self.device_id, "ts": self.ts, "active": None if self.active is None else self.active.to_json(),
                "deployment": None if self.deployment is None else self.deployment.to_json(), "last_seq": self.last_seq,
                "models": [m.to_json() for m in self.models], "memory_budget_mb": self.memory_budget_mb,
                "config": None if self.config is None else self.config.to_json()}

    @classmethod
    def of_set(cls, device_id: str, ts: float | None, models: tuple[RunningModel, ...],
               deployment: DeploymentProgress | None, last_seq: int, memory_budget_mb: float | None,
               config: ConfigStatus | None = None) -> DeviceState:
        """The state of a device that serves ``models``, with ``active`` filled in for older readers."""
        only = models[0] if len(models) == 1 and models[0].kind == "model" else None
        return cls(device_id, ts, only, deployment, last_seq, models, memory_budget_mb, config)

    def to_payload(self) -> bytes:
        return encode_json(self.to_json())

    @classmethod
    def from_payload(cls, raw: bytes) -> DeviceState:
        return cls._read(decode_json(raw, cls.LEAF))

    @classmethod
    def from_json(cls, data: Any) -> DeviceState:
        return cls._read(Fields(data, cls.LEAF))

    @classmethod
    def _read(cls, f: Fields) -> DeviceState:
        active_f, deployment, config = f.opt_obj("active"), f.opt_obj("deployment"), f.opt_obj("config")
        active = None if active_f is None else RunningModel.read(active_f)
        if f.data.get("models") is None:  # an agent from before sets: its one model is the set
            models: tuple[RunningModel, ...] = () if active is None else (active,)
        else:
            models = tuple(RunningModel.read(Fields(m, f"{f.what}.models[{i}]"))
                           for i, m in enumerate(f.array("models", 128)))
        return cls(validate_id(f.text("device_id", 64)), f.opt_number("ts"), active,
                   None if deployment is None else DeploymentProgress.read(deployment), f.opt_integer("last_seq") or 0,
                   models, f.opt_number("memory_budget_mb"), None if config is None else ConfigStatus.read(config))


@dataclass(frozen=True)
class DeviceEvent:
    """One deployment transition on a device."""

    LEAF: ClassVar[str] = "events"
    QOS: ClassVar[int] = 1
    RETAIN: ClassVar[bool] = False

    device_id: str
    deployment_id: str
    state: str
    status: str  # running | ok | failed | rolled-back | rejected
    detail: str
    ts: float
    data: dict[str, Any] = field(default_factory=dict)
    model: str | None = None  # the model or pipeline the event is about; None: the device or the whole set

    def to_payload(self) -> bytes:
        return encode_json({
            "device_id": self.device_id, "deployment_id": self.deployment_id, "state": self.state,
            "status": self.status, "detail": self.detail, "ts": self.ts, "data": self.data, "model": self.model,
        })

    @classmethod
    def from_payload(cls, raw: bytes) -> DeviceEvent:
        f = decode_json(raw, "event")
        return cls(
            validate_id(f.text("device_id", 64)), f.text("deployment_id", 64), f.text("state", 32),
            f.text("status", 32), f.text("detail", 4096), f.number("ts"),
            f.raw_obj("data") if "data" in f.data else {}, f.opt_text("model", 128),
        )


@dataclass(frozen=True)
class ChunkRequest:
    """A device asks for the chunks of an artifact it misses, as [start, end) ranges.

    ``repeat`` marks a request made after an earlier one in the same download went quiet: chunks the
    server published moments before it are still on their way to the device and are not sent again.
    Old devices do not send it; it then reads as a first request."""

    LEAF: ClassVar[str] = "chunk-requests"
    QOS: ClassVar[int] = 1
    RETAIN: ClassVar[bool] = False

    device_id: str
    artifact_id: str
    ranges: list[list[int]]
    repeat: bool = False

    def to_payload(self) -> bytes:
        return encode_json({"device_id": self.device_id, "artifact_id": self.artifact_id, "ranges": self.ranges,
                            "repeat": self.repeat})

    @classmethod
    def from_payload(cls, raw: bytes) -> ChunkRequest:
        f = decode_json(raw, "chunk-request")
        ranges = f.array("ranges", 10_000)
        for r in ranges:
            whole = isinstance(r, list) and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in r)
            if not (whole and len(r) == 2 and r[0] < r[1]):
                raise ProtocolError("chunk-request.ranges: each range must be [start, end) with 0 <= start < end")
        repeat = f.boolean("repeat") if f.data.get("repeat") is not None else False
        return cls(validate_id(f.text("device_id", 64)), validate_id(f.text("artifact_id", 64), "artifact id"), ranges, repeat)


Report = Birth | Presence | DeviceState | Telemetry | DeviceEvent | ChunkRequest | LogAnswer

_READERS: Mapping[str, Callable[[bytes], Report]] = {
    kind.LEAF: kind.from_payload for kind in (Birth, Presence, DeviceState, Telemetry, DeviceEvent, ChunkRequest, LogAnswer)
}


def read_report(topic: str, payload: bytes) -> Report:
    """The report a device published on ``topic``, about the device the topic names.

    Raises ProtocolError for a topic that carries no device report or a body that breaks its
    schema, IdentityMismatch for a body that names another device than the topic."""
    where = topics.parse_device_topic(topic)
    reader = _READERS.get(where.leaf)
    if reader is None:
        raise ProtocolError(f"{topic!r} carries no device report")
    report = reader(payload)
    if report.device_id != where.device_id:
        raise IdentityMismatch(f"{where.leaf} on the topic of {where.device_id!r} names device {report.device_id!r}")
    return report
