"""Remote log requests and their answers (``log_requests``, migration 11), written once for both engines."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from edgecore.protocol.logs import LogAnswer, LogQuery
from edgectl.controller.logs import KEEP_PER_DEVICE, LogRequest, query_json

__all__ = ["LogSql"]


class LogSql:
    """Log request rows; a back-end supplies ``_execute`` and ``_all``."""

    def _execute(self, sql: str, args: Sequence[Any] = (), at_once: bool = False) -> Any:
        raise NotImplementedError

    def _all(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        raise NotImplementedError

    def add_log_request(self, request: LogRequest, keep: int = KEEP_PER_DEVICE) -> None:
        self._execute("INSERT INTO log_requests(request_id, device_id, query, actor, asked) VALUES (?, ?, ?, ?, ?)",
                      (request.request_id, request.device_id, query_json(request.query), request.actor, request.asked))
        self._execute("DELETE FROM log_requests WHERE device_id=? AND request_id NOT IN (SELECT request_id FROM "
                      "log_requests WHERE device_id=? ORDER BY asked DESC LIMIT ?)",
                      (request.device_id, request.device_id, keep))

    def unsent_log_requests(self, asked_after: float) -> list[LogRequest]:
        return [_request(r) for r in self._all("SELECT * FROM log_requests WHERE sent IS NULL AND asked > ? "
                                               "ORDER BY asked", (asked_after,))]

    def mark_log_sent(self, request_id: str, sent: float) -> None:
        self._execute("UPDATE log_requests SET sent=? WHERE request_id=?", (sent, request_id))

    def answer_log_request(self, answer: LogAnswer, answered: float) -> bool:
        cursor = self._execute("UPDATE log_requests SET answered=?, answer=? WHERE request_id=? AND device_id=? "
                               "AND answered IS NULL", (answered, json.dumps(answer.to_json()), answer.request_id,
                                                        answer.device_id))
        return bool(cursor.rowcount == 1)

    def log_request(self, request_id: str) -> LogRequest | None:
        rows = self._all("SELECT * FROM log_requests WHERE request_id=?", (request_id,))
        return _request(rows[0]) if rows else None

    def latest_log_answer(self, device_id: str) -> LogRequest | None:
        rows = self._all("SELECT * FROM log_requests WHERE device_id=? AND answered IS NOT NULL ORDER BY asked DESC "
                         "LIMIT 1", (device_id,))
        return _request(rows[0]) if rows else None


def _request(r: Any) -> LogRequest:
    answer = None if r["answer"] is None else LogAnswer.from_payload(
        json.dumps({"schema": 1, **json.loads(r["answer"])}).encode())
    return LogRequest(r["request_id"], r["device_id"], LogQuery.from_args(json.loads(r["query"])), r["actor"] or "",
                      float(r["asked"]), r["sent"], r["answered"], answer)
