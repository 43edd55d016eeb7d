"""Protocol v1 messages: one class per topic, each read from bytes with full validation.

Controller-to-device messages (desired state, commands) travel as DSSE envelopes signed by the
controller and carry a monotonic sequence number and an expiry; device-to-controller messages
are plain JSON objects with ``"schema": 1``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from agent.errors import ProtocolError, VerificationError
from agent.protocol.envelope import Envelope, TrustedKeys
from agent.protocol.schema import Fields, decode_json, encode_json
from agent.protocol.topics import validate_id

__all__ = [
    "COMMANDS",
    "MAX_ARTIFACT_URLS",
    "ChunkRequest",
    "Command",
    "DesiredModel",
    "DesiredState",
    "DeviceEvent",
    "Presence",
    "check_addressed",
    "device_json",
    "verify_signed",
]

COMMANDS = ("rollback", "remeasure", "report")


MAX_ARTIFACT_URLS = 16


@dataclass(frozen=True)
class DesiredModel:
    """The model a device should run: its manifest envelope (signed by the package key).

    ``urls`` (optional, schema 1 readers that predate it ignore it): where the payload's bytes can
    also be fetched by HTTP(S) Range, tried in order before the MQTT chunk path."""

    name: str
    version: int
    manifest: Envelope
    urls: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"name": self.name, "version": self.version, "manifest": self.manifest.to_json()}
        if self.urls:  # absent rather than empty: the payload stays byte-identical for MQTT-only rollouts
            data["urls"] = list(self.urls)
        return data


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
        f = decode_json(raw, "desired", max_bytes=8 * 1024 * 1024)
        _expect_type(f, "desired")
        model_f = f.opt_obj("model")
        model = None
        if model_f is not None:
            model = DesiredModel(
                name=model_f.text("name", 128),
                version=model_f.integer("version", 1),
                manifest=Envelope.from_json(model_f.raw_obj("manifest")),
                urls=_checked_urls(model_f),
            )
        return cls(
            device_id=validate_id(f.text("device_id", 64)),
            seq=f.integer("seq", 1),
            issued_at=f.number("issued_at"),
            expires_at=f.number("expires_at"),
            deployment_id=validate_id(f.text("deployment_id", 64), "deployment id"),
            model=model,
            options=_checked_options(f.raw_obj("options") if "options" in f.data else {}),
        )

    @property
    def shadow_min(self) -> float | None:
        """The agreement a shadow run must reach before cut-over, or None: no shadow run asked."""
        shadow = self.options.get("shadow")
        return None if shadow is None else float(shadow["min_agreement"])


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


def _checked_options(options: dict[str, Any]) -> dict[str, Any]:
    """Options a device acts on must be well formed: ``shadow`` is ``{"min_agreement": 0..1}``."""
    shadow = options.get("shadow")
    if shadow is not None:
        value = shadow.get("min_agreement") if isinstance(shadow, dict) else None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise ProtocolError("desired: options.shadow must be {\"min_agreement\": a number from 0 to 1}")
    return options


@dataclass(frozen=True)
class Command:
    """A one-off instruction to a device (rollback, remeasure, report)."""

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


def check_addressed(message: DesiredState | Command, device_id: str, last_seq: int, now: float | None = None) -> None:
    """Refuse a controller message meant for another device, replayed, reordered or expired."""
    if message.device_id != device_id:
        raise VerificationError(f"message addressed to {message.device_id}, not {device_id}")
    if message.seq <= last_seq:
        raise VerificationError(f"stale or replayed message: seq {message.seq} <= last accepted {last_seq}")
    if (now or time.time()) > message.expires_at:
        raise VerificationError(f"message seq {message.seq} expired at {time.ctime(message.expires_at)}")


@dataclass(frozen=True)
class ChunkRequest:
    """A device asks for the chunks of an artifact it misses, as [start, end) ranges.

    ``repeat`` marks a request made after an earlier one in the same download went quiet: chunks the
    server published moments before it are still on their way to the device and are not sent again.
    Old devices do not send it; it then reads as a first request."""

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


@dataclass(frozen=True)
class Presence:
    """Online/offline marker (retained; the broker publishes the offline one as last will)."""

    device_id: str
    online: bool
    ts: float

    def to_payload(self) -> bytes:
        return encode_json({"device_id": self.device_id, "online": self.online, "ts": self.ts})

    @classmethod
    def from_payload(cls, raw: bytes) -> Presence:
        f = decode_json(raw, "presence")
        return cls(validate_id(f.text("device_id", 64)), f.boolean("online"), f.number("ts"))


@dataclass(frozen=True)
class DeviceEvent:
    """One deployment transition on a device."""

    device_id: str
    deployment_id: str
    state: str
    status: str  # running | ok | failed | rolled-back | rejected
    detail: str
    ts: float
    data: dict[str, Any] = field(default_factory=dict)

    def to_payload(self) -> bytes:
        return encode_json({
            "device_id": self.device_id, "deployment_id": self.deployment_id, "state": self.state,
            "status": self.status, "detail": self.detail, "ts": self.ts, "data": self.data,
        })

    @classmethod
    def from_payload(cls, raw: bytes) -> DeviceEvent:
        f = decode_json(raw, "event")
        return cls(
            validate_id(f.text("device_id", 64)), f.text("deployment_id", 64), f.text("state", 32),
            f.text("status", 32), f.text("detail", 4096), f.number("ts"),
            f.raw_obj("data") if "data" in f.data else {},
        )


def _expect_type(f: Fields, kind: str) -> None:
    if f.text("type", 32) != kind:
        raise ProtocolError(f"{f.what}: type must be {kind!r}")


def device_json(raw: bytes, what: str) -> dict[str, Any]:
    """Decode a free-form device report (birth, state, telemetry): a schema-1 object with a device id."""
    f = decode_json(raw, what)
    validate_id(f.text("device_id", 64))
    f.opt_number("ts")  # readers take max() of timestamps: a string, list or NaN there must not reach them
    return f.data
