"""Protocol v1 controller messages: one class per payload type, each read from bytes with full validation.

Controller-to-device messages (desired state, commands) travel as DSSE envelopes signed by the
controller and carry a monotonic sequence number and an expiry. What devices publish (plain JSON
objects with ``"schema": 1``) is in :mod:`edgecore.protocol.reports`.

The desired state has two schemas (docs/protocol.md, Desired state): schema 1
(:class:`DesiredState`) names one model; schema 2 (:class:`DesiredSet`) names the whole set of
models and pipelines a device runs, each with its own version, manifest, URLs, deployment id and
options, under one sequence number. :func:`read_desired` reads either; an agent that speaks
schema 2 says so in its birth (``desired_schemas``), and takes a schema 1 desired state as the set
of its one model (:meth:`DesiredState.as_set`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from edgecore.errors import ProtocolError, VerificationError
from edgecore.protocol.envelope import Envelope, TrustedKeys
from edgecore.protocol.schema import Fields, decode_json, encode_json
from edgecore.protocol.topics import validate_id
from edgecore.windows import Maintenance, WindowError

__all__ = [
    "COMMANDS",
    "DESIRED_SCHEMAS",
    "MAX_ARTIFACT_URLS",
    "MAX_SET_MODELS",
    "MAX_SET_PIPELINES",
    "Command",
    "DeployOptions",
    "DesiredModel",
    "DesiredSet",
    "DesiredState",
    "check_addressed",
    "read_desired",
    "verify_signed",
]

COMMANDS = ("rollback", "remeasure", "report", "logs")  # logs: args are edgecore.protocol.logs.LogQuery

DESIRED_SCHEMAS = (1, 2)  # the desired-state schemas this code reads (and an agent built on it speaks)
MAX_ARTIFACT_URLS = 16
MAX_SET_MODELS = 64
MAX_SET_PIPELINES = 16
MAX_DESIRED_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class DeployOptions:
    """What the controller asks of one model's deployment: a downgrade allowed, a shadow run before cut-over, and
    when it may install (``maintenance``: its groups' windows in the device's local time, a forced-update deadline)."""

    allow_downgrade: bool = False
    shadow_min: float | None = None  # the agreement a shadow run must reach; None: no shadow run
    maintenance: Maintenance | None = None  # None: install at once

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"allow_downgrade": self.allow_downgrade}
        if self.shadow_min is not None:
            data["shadow"] = {"min_agreement": self.shadow_min}
        if self.maintenance:
            data["maintenance"] = self.maintenance.to_json()
        return data

    @classmethod
    def read(cls, options: dict[str, Any], what: str) -> DeployOptions:
        """``options`` as schema 1 writes them at the top level and schema 2 per model."""
        _checked_options(options, what)
        downgrade = options.get("allow_downgrade", False)
        if not isinstance(downgrade, bool):
            raise ProtocolError(f"{what}.allow_downgrade: expected bool, got {type(downgrade).__name__}")
        shadow = options.get("shadow")
        maintenance = None
        if options.get("maintenance") is not None:
            try:
                maintenance = Maintenance.from_json(options["maintenance"], f"{what}.maintenance")
            except WindowError as exc:
                raise ProtocolError(str(exc)) from None
        return cls(downgrade, None if shadow is None else float(shadow["min_agreement"]), maintenance)


@dataclass(frozen=True)
class DesiredModel:
    """A model (or a pipeline) a device should run: its manifest envelope (signed by the package key).

    ``urls`` (optional, schema 1 readers that predate it ignore it): where the payload's bytes can
    also be fetched by HTTP(S) Range, tried in order before the MQTT chunk path. ``deployment_id``
    and ``options`` are schema 2's, per model: in schema 1 the desired state's own apply."""

    name: str
    version: int
    manifest: Envelope
    urls: tuple[str, ...] = ()
    deployment_id: str = ""
    options: DeployOptions = field(default_factory=DeployOptions)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"name": self.name, "version": self.version, "manifest": self.manifest.to_json()}
        if self.urls:  # absent rather than empty: the payload stays byte-identical for MQTT-only rollouts
            data["urls"] = list(self.urls)
        return data

    def to_set_json(self) -> dict[str, Any]:
        """The entry as schema 2 writes it (with its deployment id and options)."""
        return {**self.to_json(), "deployment_id": self.deployment_id, "options": self.options.to_json()}

    @classmethod
    def read(cls, f: Fields) -> DesiredModel:
        """A schema 1 ``model`` object."""
        return cls(f.text("name", 128), f.integer("version", 1), Envelope.from_json(f.raw_obj("manifest")), _checked_urls(f))

    @classmethod
    def read_entry(cls, f: Fields) -> DesiredModel:
        """A schema 2 entry of ``models`` or ``pipelines``: its name is a safe id (a directory and a URL path)."""
        name = validate_id(f.text("name", 64), f"{f.what}.name")
        options = DeployOptions.read(f.raw_obj("options") if "options" in f.data else {}, f"{f.what}.options")
        return cls(name, f.integer("version", 1), Envelope.from_json(f.raw_obj("manifest")), _checked_urls(f),
                   validate_id(f.text("deployment_id", 64), f"{f.what}.deployment_id"), options)


@dataclass(frozen=True)
class DesiredState:
    """What the controller wants a device to run. ``model`` None means: keep what you have."""

    device_id: str
    seq: int
    issued_at: float
    expires_at: float
    deployment_id: str
    model: DesiredModel | None
    options: dict[str, Any] = field(default_factory=dict)

    def to_payload(self) -> bytes:
        model = None if self.model is None else self.model.to_json()
        return encode_json({
            "type": "desired", "device_id": self.device_id, "seq": self.seq, "issued_at": self.issued_at,
            "expires_at": self.expires_at, "deployment_id": self.deployment_id, "model": model,
            "options": self.options,
        })

    @classmethod
    def from_payload(cls, raw: bytes) -> DesiredState:
        return cls._read(decode_json(raw, "desired", max_bytes=MAX_DESIRED_BYTES))

    @classmethod
    def _read(cls, f: Fields) -> DesiredState:
        _expect_type(f, "desired")
        model_f = f.opt_obj("model")
        return cls(
            device_id=validate_id(f.text("device_id", 64)),
            seq=f.integer("seq", 1),
            issued_at=f.number("issued_at"),
            expires_at=f.number("expires_at"),
            deployment_id=validate_id(f.text("deployment_id", 64), "deployment id"),
            model=None if model_f is None else DesiredModel.read(model_f),
            options=_checked_options(f.raw_obj("options") if "options" in f.data else {}, "desired: options"),
        )

    @property
    def shadow_min(self) -> float | None:
        """The agreement a shadow run must reach before cut-over, or None: no shadow run asked."""
        shadow = self.options.get("shadow")
        return None if shadow is None else float(shadow["min_agreement"])

    def as_set(self) -> DesiredSet | None:
        """The schema 2 set this desired state means: its one model, with this state's id and options; None: keep.

        Raises ProtocolError when the model's name cannot name a member of a set (not a safe id)."""
        if self.model is None:
            return None
        model = replace(self.model, name=validate_id(self.model.name, "desired: model.name"),
                        deployment_id=self.deployment_id,
                        options=DeployOptions.read(self.options, "desired: options"))
        return DesiredSet(self.device_id, self.seq, self.issued_at, self.expires_at, self.deployment_id, (model,), ())


@dataclass(frozen=True)
class DesiredSet:
    """Schema 2: every model and pipeline a device should run, under one sequence number.

    A model or pipeline the device runs that the set does not name is removed. ``deployment_id``
    names this change of the set as a whole (events about the whole set, such as an admission
    refusal, carry it); each entry carries the id of the deployment that put its version there."""

    SCHEMA: ClassVar[int] = 2

    device_id: str
    seq: int
    issued_at: float
    expires_at: float
    deployment_id: str
    models: tuple[DesiredModel, ...]
    pipelines: tuple[DesiredModel, ...] = ()

    def entry(self, name: str) -> DesiredModel | None:
        """The model or pipeline called ``name`` in the set."""
        return next((e for e in (*self.models, *self.pipelines) if e.name == name), None)

    def to_payload(self) -> bytes:
        return encode_json({
            "type": "desired", "device_id": self.device_id, "seq": self.seq, "issued_at": self.issued_at,
            "expires_at": self.expires_at, "deployment_id": self.deployment_id,
            "models": [m.to_set_json() for m in self.models], "pipelines": [p.to_set_json() for p in self.pipelines],
        }, schema=self.SCHEMA)

    @classmethod
    def from_payload(cls, raw: bytes) -> DesiredSet:
        return cls._read(decode_json(raw, "desired", max_bytes=MAX_DESIRED_BYTES, schemas=(cls.SCHEMA,)))

    @classmethod
    def _read(cls, f: Fields) -> DesiredSet:
        _expect_type(f, "desired")
        models = _entries(f, "models", MAX_SET_MODELS)
        pipelines = _entries(f, "pipelines", MAX_SET_PIPELINES) if f.data.get("pipelines") is not None else ()
        names = [e.name for e in (*models, *pipelines)]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ProtocolError(f"desired: {', '.join(twice)} named twice (models and pipelines share one name space)")
        return cls(
            device_id=validate_id(f.text("device_id", 64)),
            seq=f.integer("seq", 1),
            issued_at=f.number("issued_at"),
            expires_at=f.number("expires_at"),
            deployment_id=validate_id(f.text("deployment_id", 64), "deployment id"),
            models=models,
            pipelines=pipelines,
        )


def _entries(f: Fields, key: str, limit: int) -> tuple[DesiredModel, ...]:
    return tuple(DesiredModel.read_entry(Fields(e, f"desired.{key}[{i}]")) for i, e in enumerate(f.array(key, limit)))


def read_desired(raw: bytes) -> DesiredState | DesiredSet:
    """A desired state of either schema, by its ``"schema"`` (any other is refused naming the ones spoken)."""
    f = decode_json(raw, "desired", max_bytes=MAX_DESIRED_BYTES, schemas=DESIRED_SCHEMAS)
    return DesiredSet._read(f) if f.data["schema"] == DesiredSet.SCHEMA else DesiredState._read(f)


def _checked_urls(model: Fields) -> tuple[str, ...]:
    """``model.urls``: at most 16 absolute http(s) URLs; anything else rejects the whole desired state."""
    if model.data.get("urls") is None:
        return ()
    urls = model.array("urls", MAX_ARTIFACT_URLS)
    for url in urls:
        if not isinstance(url, str) or len(url) > 4096 or not url.startswith(("http://", "https://")) \
                or any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
            raise ProtocolError(f"{model.what}.urls: each entry must be an http:// or https:// URL of at most 4096"
                                " characters without spaces or control characters")
    return tuple(urls)


def _checked_options(options: dict[str, Any], what: str) -> dict[str, Any]:
    """Options a device acts on must be well formed: ``shadow`` is ``{"min_agreement": 0..1}``."""
    shadow = options.get("shadow")
    if shadow is not None:
        value = shadow.get("min_agreement") if isinstance(shadow, dict) else None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise ProtocolError(f"{what}.shadow must be {{\"min_agreement\": a number from 0 to 1}}")
    return options


@dataclass(frozen=True)
class Command:
    """A one-off instruction to a device (rollback, remeasure, report, logs)."""

    device_id: str
    seq: int
    issued_at: float
    expires_at: float
    command: str
    args: dict[str, Any] = field(default_factory=dict)

    def to_payload(self) -> bytes:
        return encode_json({
            "type": "command", "device_id": self.device_id, "seq": self.seq, "issued_at": self.issued_at,
            "expires_at": self.expires_at, "command": self.command, "args": self.args,
        })

    @classmethod
    def from_payload(cls, raw: bytes) -> Command:
        f = decode_json(raw, "command")
        _expect_type(f, "command")
        command = f.text("command", 32)
        if command not in COMMANDS:
            raise ProtocolError(f"command: unknown command {command!r} (known: {', '.join(COMMANDS)})")
        return cls(
            device_id=validate_id(f.text("device_id", 64)),
            seq=f.integer("seq", 1),
            issued_at=f.number("issued_at"),
            expires_at=f.number("expires_at"),
            command=command,
            args=f.raw_obj("args") if "args" in f.data else {},
        )


def verify_signed(raw: bytes, trusted: TrustedKeys, payload_type: str) -> bytes:
    """Check a controller envelope's signature and type; return its payload bytes unparsed.

    The caller then parses the payload and checks address, sequence and expiry with
    :func:`check_addressed`."""
    return trusted.verify(Envelope.from_bytes(raw), payload_type)


def check_addressed(message: DesiredState | DesiredSet | Command, device_id: str, last_seq: int,
                    now: float | None = None) -> None:
    """Refuse a controller message meant for another device, replayed, reordered or expired."""
    if message.device_id != device_id:
        raise VerificationError(f"message addressed to {message.device_id}, not {device_id}")
    if message.seq <= last_seq:
        raise VerificationError(f"stale or replayed message: seq {message.seq} <= last accepted {last_seq}")
    if (now or time.time()) > message.expires_at:
        raise VerificationError(f"message seq {message.seq} expired at {time.ctime(message.expires_at)}")


def _expect_type(f: Fields, kind: str) -> None:
    if f.text("type", 32) != kind:
        raise ProtocolError(f"{f.what}: type must be {kind!r}")
