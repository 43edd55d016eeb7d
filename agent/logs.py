"""The agent's recent log records, kept in memory for remote reading (docs/fleet.md, Remote logs).

:class:`LogRing` is a logging handler installed on the root logger while the agent runs: it keeps
the newest records, bounded in count and in bytes, each redacted (agent.redaction) and cut to
:data:`~edgecore.protocol.logs.MAX_LINE_CHARS` as it is taken, so no secret sits in the ring and no
record can push the others out alone. :meth:`LogRing.answer` picks what a ``logs`` command asks and
fits it into one answer of at most :data:`~edgecore.protocol.logs.MAX_ANSWER_BYTES`.
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque

from agent.redaction import redact
from edgecore.protocol.logs import LEVELS, MAX_ANSWER_BYTES, MAX_LINE_CHARS, LogAnswer, LogLine, LogQuery

__all__ = ["MAX_RING_BYTES", "MAX_RING_LINES", "LogRing"]

MAX_RING_LINES = 5000
MAX_RING_BYTES = 1024 * 1024
_ENVELOPE_BYTES = 512  # the answer's fields besides its lines, with room to spare


class LogRing(logging.Handler):
    """The newest log records, at most ``max_lines`` of them and ``max_bytes`` of message text."""

    def __init__(self, max_lines: int = MAX_RING_LINES, max_bytes: int = MAX_RING_BYTES) -> None:
        super().__init__(logging.DEBUG)
        self.max_lines = max_lines
        self.max_bytes = max_bytes
        self._lines: deque[LogLine] = deque()
        self._bytes = 0

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
            if record.exc_info:
                text = f"{text}\n{logging.Formatter().formatException(record.exc_info)}"
        except Exception:  # a record whose arguments do not format is kept as its template
            text = str(record.msg)
        # Cut before redacting too: a 1 MB message costs no more than a long line (a secret cut short is still matched).
        line = LogLine(record.created, record.levelname, record.name[:256], _cut(redact(text[:4 * MAX_LINE_CHARS])))
        self._lines.append(line)  # Handler.handle holds self.lock around emit
        self._bytes += len(line.message.encode())
        while len(self._lines) > self.max_lines or self._bytes > self.max_bytes:
            self._bytes -= len(self._lines.popleft().message.encode())

    def held(self) -> list[LogLine]:
        with self.lock:  # type: ignore[union-attr]  # createLock() always sets it
            return list(self._lines)

    def answer(self, device_id: str, query: LogQuery) -> LogAnswer:
        """The newest ``query.lines`` records in its time range at its level or above, within the answer's byte cap."""
        held = self.held()
        floor = LEVELS.index(query.level)
        matching = [line for line in held if _rank(line.level) >= floor
                    and (query.since is None or line.ts >= query.since)
                    and (query.until is None or line.ts <= query.until)][-query.lines:]
        budget, kept = MAX_ANSWER_BYTES - _ENVELOPE_BYTES, 0
        for line in reversed(matching):  # newest first: the byte cap leaves the oldest out
            size = len(json.dumps(line.to_json(), separators=(",", ":")).encode()) + 1
            if size > budget:
                break
            budget -= size
            kept += 1
        lines = tuple(matching[len(matching) - kept:])
        return LogAnswer(device_id, query.request_id, time.time(), lines, kept < len(matching),
                         held[0].ts if held else None)


def _cut(text: str) -> str:
    return text if len(text) <= MAX_LINE_CHARS else text[:MAX_LINE_CHARS - 1] + "…"


def _rank(level: str) -> int:
    return LEVELS.index(level) if level in LEVELS else 0
