"""Remote logs on the controller: requests and answers kept in the store, so any replica can take either part.

An operator's request (``POST /api/v1/devices/{id}/logs``) is stored; the engine leader signs and
sends it as a ``logs`` command (:func:`send_pending`); whichever replica receives the device's
answer stores it against its request (:func:`take_answer`); the API replica that took the request
reads it back (:func:`wait_for_answer`). An answer to no request of that device is dropped and
counted (``unasked``); a request nobody answers reads as unanswered, never as empty logs.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgecore.errors import NotFoundError, OperationFailed
from edgecore.protocol.envelope import COMMAND_TYPE, sign
from edgecore.protocol.logs import LogAnswer, LogQuery
from edgecore.protocol.messages import Command
from edgectl.controller.records import DeviceRecord
from edgectl.sequence import next_sequence

__all__ = ["DEFAULT_WAIT_S", "MAX_WAIT_S", "SEND_WITHIN_S", "LogRequest", "LogStore", "NoAnswer", "ask_logs", "new_request_id",
           "send_pending", "take_answer", "wait_for_answer"]

SEND_WITHIN_S = 30.0  # a request the leader could not send within this long is not sent late
COMMAND_VALIDITY_S = 60.0  # the signed command's expiry: an answer later than this helps nobody
KEEP_PER_DEVICE = 10  # the newest requests (and answers) kept per device
DEFAULT_WAIT_S = 10.0  # how long the API and the CLI wait for an answer, unless told
MAX_WAIT_S = 30.0


@dataclass(frozen=True)
class LogRequest:
    """One operator request for a device's logs, and its answer once one came."""

    request_id: str
    device_id: str
    query: LogQuery
    actor: str
    asked: float
    sent: float | None = None
    answered: float | None = None
    answer: LogAnswer | None = None

    def to_dict(self) -> dict[str, Any]:
        answer = self.answer
        return {"request_id": self.request_id, "device_id": self.device_id, "query": self.query.to_args(),
                "actor": self.actor, "asked": self.asked, "sent": self.sent, "answered": self.answered,
                "lines": None if answer is None else [line.to_json() for line in answer.lines],
                "truncated": None if answer is None else answer.truncated,
                "held_since": None if answer is None else answer.held_since}


class NoAnswer(OperationFailed):
    """The device did not answer in time; the message says whether the request was sent at all."""


class LogStore(Protocol):
    """Log requests and their answers (``store/logs.py``)."""

    def now(self) -> float: ...
    def device(self, device_id: str) -> DeviceRecord | None: ...

    def add_log_request(self, request: LogRequest, keep: int = KEEP_PER_DEVICE) -> None:
        """Store a new request; drop that device's requests older than its newest ``keep``."""
    def unsent_log_requests(self, asked_after: float) -> list[LogRequest]:
        """Requests not sent yet, asked after ``asked_after``, oldest first."""
    def mark_log_sent(self, request_id: str, sent: float) -> None: ...
    def answer_log_request(self, answer: LogAnswer, answered: float) -> bool:
        """Keep ``answer`` on its unanswered request of the same device; False when there is none."""
    def log_request(self, request_id: str) -> LogRequest | None: ...
    def latest_log_answer(self, device_id: str) -> LogRequest | None:
        """The device's newest answered request."""


def new_request_id() -> str:
    return f"logs-{uuid.uuid4().hex[:16]}"


def send_pending(store: LogStore, key: Ed25519PrivateKey, send: Callable[[str, str, bytes], bool], now: float) -> int:
    """Sign and send (``send(device_id, leaf, payload)``) every request not sent yet: the leader, each tick.

    Signed at sending, not when asked, so that its sequence number is not older than a desired state the leader
    signed meanwhile (the device would refuse it as stale). Returns how many went."""
    sent = 0
    for request in store.unsent_log_requests(now - SEND_WITHIN_S):
        command = Command(request.device_id, next_sequence(), now, now + COMMAND_VALIDITY_S, "logs",
                          request.query.to_args())
        if send(request.device_id, "commands", sign(COMMAND_TYPE, command.to_payload(), key).to_bytes()):
            store.mark_log_sent(request.request_id, now)
            sent += 1
    return sent


def ask_logs(store: LogStore, device_id: str, query: LogQuery, actor: str, wait_s: float = DEFAULT_WAIT_S) -> LogRequest:
    """Store a request for ``device_id``'s logs and wait for the answer; the running controller's leader sends it.

    Raises NotFoundError for a device the store does not know, OperationFailed for a decommissioned one (nothing
    stored either way), NoAnswer when ``wait_s`` passed (the answer, if it comes later, is kept)."""
    record = store.device(device_id)
    if record is None:
        raise NotFoundError(f"device_id: no device {device_id!r} in the controller store")
    if record.decommissioned is not None:
        raise OperationFailed(f"device_id: device {device_id!r} was decommissioned: it is sent nothing")
    store.add_log_request(LogRequest(query.request_id, device_id, query, actor, store.now()))
    answered = wait_for_answer(store, query.request_id, wait_s)
    if answered is not None:
        return answered
    request = store.log_request(query.request_id)
    if request is None or request.sent is None:
        raise NoAnswer(f"no answer from {device_id} within {wait_s:g}s: the request was not sent (no controller is "
                       f"leading the engine, or its broker is down); request {query.request_id}")
    raise NoAnswer(f"no answer from {device_id} within {wait_s:g}s after the request was sent (the device may be "
                   f"offline); its answer, if it comes, is kept for `GET .../logs`; request {query.request_id}")


def take_answer(store: LogStore, answer: LogAnswer, received: float) -> bool:
    """Store a device's answer on its request; False (the caller counts it) when the device was asked no such thing.

    The same answer again (QoS 1 redelivers; without shared subscriptions every replica receives it) is no drop:
    the first one kept stays."""
    if store.answer_log_request(answer, received):
        return True
    request = store.log_request(answer.request_id)
    return request is not None and request.device_id == answer.device_id and request.answer is not None


def wait_for_answer(store: LogStore, request_id: str, timeout_s: float, poll_s: float = 0.1) -> LogRequest | None:
    """The request once answered, or None when ``timeout_s`` passed without an answer."""
    deadline = time.monotonic() + timeout_s
    while True:
        request = store.log_request(request_id)
        if request is not None and request.answer is not None:
            return request
        if time.monotonic() >= deadline:
            return None
        time.sleep(poll_s)


def query_json(query: LogQuery) -> str:
    return json.dumps(query.to_args(), separators=(",", ":"))
