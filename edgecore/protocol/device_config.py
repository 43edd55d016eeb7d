"""Device configuration: the signed, versioned settings a controller may change on a running agent.

The controller publishes a :class:`DeviceConfig` retained on ``edge/v1/devices/<id>/config`` as a DSSE
envelope of :data:`CONFIG_TYPE` signed by a controller key (docs/protocol.md, Device configuration).
Its ``settings`` (:class:`ConfigSettings`) may set only the keys of :data:`CONFIG_KEYS`, each with a
type and bounds; the controller's API and the agent read them with the same code, so what the API
takes the agent takes. The agent reports what became of the newest version in its state
(:class:`ConfigStatus`).
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

from edgecore.errors import ProtocolError, VerificationError
from edgecore.protocol.schema import Fields, decode_json, encode_json
from edgecore.protocol.topics import validate_id
from edgecore.windows import MAX_WINDOWS, WindowError, Windows

__all__ = [
    "CONFIG_KEYS",
    "CONFIG_TYPE",
    "LOG_LEVELS",
    "MAX_TAGS",
    "ConfigSettings",
    "ConfigState",
    "ConfigStatus",
    "DeviceConfig",
]

CONFIG_TYPE = "application/vnd.edgectl.config.v1+json"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
MAX_TAGS = 32
# The keys a remote configuration may set, named as in agent.yaml, and what each takes.
CONFIG_KEYS: dict[str, str] = {
    "telemetry_interval_s": "number of seconds, 1 to 3600",
    "log_level": f"one of {', '.join(LOG_LEVELS)}",
    "tags": f"object of at most {MAX_TAGS} tags: id-like keys, values of at most 128 characters",
    "inference.max_queue": "integer, 0 to 65536 (requests that wait for an inference worker)",
    "maintenance_windows": f"list of at most {MAX_WINDOWS} windows, DAYS HH:MM-HH:MM in device time ([]: install any time)",
}


@dataclass(frozen=True)
class ConfigSettings:
    """The keys a configuration sets; None leaves agent.yaml's value (or its default) in force."""

    telemetry_interval_s: float | None = None
    log_level: str | None = None
    tags: dict[str, str] | None = None
    inference_max_queue: int | None = None
    maintenance_windows: tuple[str, ...] | None = None  # canonical texts (edgecore.windows)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"telemetry_interval_s": self.telemetry_interval_s, "log_level": self.log_level,
                                "tags": self.tags, "inference.max_queue": self.inference_max_queue,
                                "maintenance_windows": None if self.maintenance_windows is None
                                else list(self.maintenance_windows)}
        return {key: value for key, value in data.items() if value is not None}

    @classmethod
    def from_json(cls, data: Any, what: str = "settings") -> ConfigSettings:
        """Read and check every key; ProtocolError naming ``what.key`` for an unknown key or a bad value."""
        f = Fields(data, what)
        unknown = sorted(set(f.data) - set(CONFIG_KEYS))
        if unknown:
            raise ProtocolError(f"{what}.{unknown[0]}: not a key a configuration may set (known: {', '.join(CONFIG_KEYS)})")
        interval = f.opt_number("telemetry_interval_s")
        if interval is not None and not 1 <= interval <= 3600:
            raise ProtocolError(f"{what}.telemetry_interval_s: {interval} is outside [1, 3600]")
        level = f.opt_text("log_level", 16)
        if level is not None and level.upper() not in LOG_LEVELS:
            raise ProtocolError(f"{what}.log_level: {level!r} is not one of {', '.join(LOG_LEVELS)}")
        return cls(interval, None if level is None else level.upper(), _tags(f, what),
                   f.opt_integer("inference.max_queue", 0, 65536), _windows(f, what))


def _windows(f: Fields, what: str) -> tuple[str, ...] | None:
    if f.data.get("maintenance_windows") is None:
        return None
    try:
        return tuple(Windows.parse(f.data["maintenance_windows"], f"{what}.maintenance_windows").texts())
    except WindowError as exc:
        raise ProtocolError(str(exc)) from None


def _tags(f: Fields, what: str) -> dict[str, str] | None:
    if f.data.get("tags") is None:
        return None
    tags = f.obj("tags")
    if len(tags.data) > MAX_TAGS:
        raise ProtocolError(f"{what}.tags: more than {MAX_TAGS} tags")
    for key in tags.data:
        try:
            validate_id(key, "tag key")
        except ProtocolError as exc:
            raise ProtocolError(f"{what}.tags: {exc}") from None
    return {key: tags.text(key, 128) for key in tags.data}


@dataclass(frozen=True)
class DeviceConfig:
    """One version of a device's configuration, as signed by the controller."""

    device_id: str
    version: int
    issued_at: float
    expires_at: float
    settings: ConfigSettings = field(default_factory=ConfigSettings)

    def to_json(self) -> dict[str, Any]:
        return {"type": "config", "device_id": self.device_id, "version": self.version, "issued_at": self.issued_at,
                "expires_at": self.expires_at, "settings": self.settings.to_json()}

    def to_payload(self) -> bytes:
        return encode_json(self.to_json())

    @classmethod
    def from_payload(cls, raw: bytes) -> DeviceConfig:
        return cls.read(decode_json(raw, "config"))

    @classmethod
    def read(cls, f: Fields) -> DeviceConfig:
        if f.text("type", 32) != "config":
            raise ProtocolError(f"{f.what}: type must be 'config'")
        return cls(validate_id(f.text("device_id", 64)), f.integer("version", 1), f.number("issued_at"),
                   f.number("expires_at"), ConfigSettings.from_json(f.raw_obj("settings"), f"{f.what}.settings"))

    def check_for(self, device_id: str, now: float | None = None) -> None:
        """Refuse a configuration addressed to another device or expired."""
        if self.device_id != device_id:
            raise VerificationError(f"configuration addressed to {self.device_id}, not {device_id}")
        if (now or time.time()) > self.expires_at:
            raise VerificationError(f"configuration version {self.version} expired at {time.ctime(self.expires_at)}")


class ConfigState(str, enum.Enum):
    """What became of a configuration version on the device (saved in its config.json: never rename)."""

    APPLIED = "applied"
    REFUSED = "refused"


@dataclass(frozen=True)
class ConfigStatus:
    """The ``config`` of a device's state: the newest version it handled, and whether it is in force."""

    WHAT: ClassVar[str] = "config"

    version: int
    status: ConfigState
    reason: str = ""
    applied_version: int = 0  # the version in force (0: none, agent.yaml alone)

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "status": self.status.value, "reason": self.reason,
                "applied_version": self.applied_version}

    @classmethod
    def read(cls, f: Fields) -> ConfigStatus:
        status = f.text("status", 16)
        if status not in {s.value for s in ConfigState}:
            raise ProtocolError(f"{f.what}.status: {status!r} is not applied or refused")
        return cls(f.integer("version"), ConfigState(status), f.opt_text("reason", 4096) or "",
                   f.opt_integer("applied_version") or 0)
