"""Remote logs: what an operator asks a device for, and what the device answers (docs/protocol.md, Remote logs).

The controller asks with the signed command ``logs`` (:class:`edgecore.protocol.messages.Command`),
whose ``args`` are a :class:`LogQuery`: the last ``lines`` records, or those between ``since`` and
``until`` (Unix seconds), at ``level`` or above. The device answers on its own ``logs`` topic with a
:class:`LogAnswer` of at most :data:`MAX_ANSWER_BYTES`: newest lines first kept, ``truncated`` when
the cap left older matching lines out, ``held_since`` the oldest record its memory still holds
(older than that is unknown, not empty).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from edgecore.errors import ProtocolError
from edgecore.protocol.schema import Fields, decode_json, encode_json
from edgecore.protocol.topics import validate_id

__all__ = ["DEFAULT_LINES", "LEVELS", "MAX_ANSWER_BYTES", "MAX_LINES", "MAX_LINE_CHARS", "LogAnswer", "LogLine",
           "LogQuery"]

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
DEFAULT_LINES = 100
MAX_LINES = 1000  # the most lines one request may ask for
MAX_LINE_CHARS = 2000  # a longer record is cut (and ends with "…")
MAX_ANSWER_BYTES = 64 * 1024  # the answer's whole payload, JSON included


@dataclass(frozen=True)
class LogQuery:
    """The ``args`` of a ``logs`` command: which records, at which level or above, under which request id."""

    request_id: str
    lines: int = DEFAULT_LINES
    since: float | None = None
    until: float | None = None
    level: str = "DEBUG"

    @classmethod
    def asked(cls, request_id: str, lines: int | None, since: float | None, until: float | None, level: str) -> LogQuery:
        """What an operator asked: ``lines`` unsaid is :data:`DEFAULT_LINES`, or :data:`MAX_LINES` with a time range."""
        if lines is None:
            lines = DEFAULT_LINES if since is None and until is None else MAX_LINES
        return cls(request_id, lines, since, until, level)

    def to_args(self) -> dict[str, Any]:
        args: dict[str, Any] = {"request_id": self.request_id, "lines": self.lines, "level": self.level}
        if self.since is not None:
            args["since"] = self.since
        if self.until is not None:
            args["until"] = self.until
        return args

    @classmethod
    def from_args(cls, args: dict[str, Any]) -> LogQuery:
        """Raises ProtocolError naming the field for anything out of bounds."""
        f = Fields(args, "logs")
        lines = f.opt_integer("lines", 1, MAX_LINES)
        since, until = f.opt_number("since"), f.opt_number("until")
        if since is not None and until is not None and since > until:
            raise ProtocolError("logs.since: later than logs.until")
        level = f.opt_text("level", 16) or "DEBUG"
        if level not in LEVELS:
            raise ProtocolError(f"logs.level: {level[:16]!r} is not one of {', '.join(LEVELS)}")
        return cls(validate_id(f.text("request_id", 64), "logs.request_id"), DEFAULT_LINES if lines is None else lines,
                   since, until, level)


@dataclass(frozen=True)
class LogLine:
    """One log record as the device kept it (already redacted)."""

    ts: float
    level: str
    logger: str
    message: str

    def to_json(self) -> dict[str, Any]:
        return {"ts": self.ts, "level": self.level, "logger": self.logger, "message": self.message}

    @classmethod
    def read(cls, f: Fields) -> LogLine:
        return cls(f.number("ts"), f.text("level", 16), f.text("logger", 256), f.text("message", MAX_LINE_CHARS))


@dataclass(frozen=True)
class LogAnswer:
    """A device's answer to one ``logs`` request, oldest line first."""

    LEAF: ClassVar[str] = "logs"
    QOS: ClassVar[int] = 1
    RETAIN: ClassVar[bool] = False

    device_id: str
    request_id: str
    ts: float
    lines: tuple[LogLine, ...]
    truncated: bool
    held_since: float | None  # the oldest record the device still holds; None: it holds none

    def to_json(self) -> dict[str, Any]:
        return {"device_id": self.device_id, "request_id": self.request_id, "ts": self.ts,
                "lines": [line.to_json() for line in self.lines], "truncated": self.truncated,
                "held_since": self.held_since}

    def to_payload(self) -> bytes:
        return encode_json(self.to_json())

    @classmethod
    def from_payload(cls, raw: bytes) -> LogAnswer:
        f = decode_json(raw, cls.LEAF, max_bytes=MAX_ANSWER_BYTES)
        lines = f.array("lines", MAX_LINES)
        return cls(validate_id(f.text("device_id", 64)), validate_id(f.text("request_id", 64), "logs.request_id"),
                   f.number("ts"), tuple(LogLine.read(Fields(e, f"logs.lines[{i}]")) for i, e in enumerate(lines)),
                   f.boolean("truncated"), f.opt_number("held_since"))
