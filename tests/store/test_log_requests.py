"""Remote log requests and answers in the store (migration 12), on SQLite and PostgreSQL: any replica may take each part."""

from __future__ import annotations

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgecore.protocol.logs import LogAnswer, LogLine, LogQuery
from edgecore.transport import Message
from edgectl.controller.ingest import Ingest
from edgectl.controller.logs import LogRequest, send_pending, take_answer
from edgectl.controller.store import Store


def request(request_id: str, device_id: str = "cam-1", asked: float = 100.0) -> LogRequest:
    return LogRequest(request_id, device_id, LogQuery(request_id, 20, None, None, "INFO"), "api:ana", asked)


def answer(request_id: str, device_id: str = "cam-1") -> LogAnswer:
    return LogAnswer(device_id, request_id, 101.0, (LogLine(99.0, "INFO", "agent", "up"),), False, 90.0)


def test_a_request_is_sent_once_answered_once_by_its_own_device_and_read_back(store: Store) -> None:
    store.add_log_request(request("logs-1"))
    store.add_log_request(request("logs-old", asked=10.0))
    sent: list[tuple[str, str]] = []
    key = Ed25519PrivateKey.generate()

    def send(device: str, leaf: str, _payload: bytes) -> bool:
        sent.append((device, leaf))
        return True

    assert send_pending(store, key, send, now=120.0) == 1
    assert sent == [("cam-1", "commands")]  # the one asked more than 30 s before is not sent late
    assert send_pending(store, key, lambda *_: True, now=121.0) == 0  # sent once
    assert store.latest_log_answer("cam-1") is None
    assert not take_answer(store, answer("logs-1", "cam-2"), 130.0)  # another device cannot answer it
    assert not take_answer(store, answer("logs-none"), 130.0)
    assert take_answer(store, answer("logs-1"), 130.0)
    assert take_answer(store, answer("logs-1"), 131.0)  # again (another replica, a redelivery): no drop, the first stays
    kept = store.log_request("logs-1")
    assert kept is not None and kept.sent == 120.0 and kept.answered == 130.0 and kept.answer == answer("logs-1")
    assert store.latest_log_answer("cam-1") == kept


def test_only_the_newest_requests_of_a_device_are_kept(store: Store) -> None:
    for i in range(5):
        store.add_log_request(request(f"logs-{i}", asked=100.0 + i), keep=3)
    store.add_log_request(request("logs-other", "cam-2", asked=1.0), keep=3)
    assert [store.log_request(f"logs-{i}") is not None for i in range(5)] == [False, False, True, True, True]
    assert store.log_request("logs-other") is not None


HOSTILE = [
    b"not json", b"[]", b'{"schema": 1}', b'{"schema": 2, "device_id": "cam-1", "request_id": "logs-1"}',
    b'{"schema": 1, "device_id": "cam-1", "request_id": "logs-1", "ts": NaN, "lines": [], "truncated": false}',
    b'{"schema": 1, "device_id": "cam-1", "request_id": "logs-1", "ts": 1, "lines": [{"ts": 1}], "truncated": false}',
    b'{"schema": 1, "device_id": "cam-1", "request_id": "../x", "ts": 1, "lines": [], "truncated": false}',
    b'{"schema": 1, "device_id": "cam-1", "request_id": "logs-1", "ts": 1, "lines": [], "truncated": false, "pad": "'
    + b"x" * (64 * 1024) + b'"}',
]


def test_hostile_answers_are_dropped_counted_and_never_stored(store: Store) -> None:
    store.add_log_request(request("logs-1"))
    ingest = Ingest(store)
    for raw in HOSTILE:
        assert ingest.apply(Message("edge/v1/devices/cam-1/logs", raw, False), 130.0) is None
    assert ingest.drops["malformed-logs"] == len(HOSTILE)
    ingest.apply(Message("edge/v1/devices/cam-2/logs", answer("logs-1").to_payload(), False), 130.0)  # body names cam-1
    assert ingest.drops["identity"] == 1
    kept = store.log_request("logs-1")
    assert kept is not None and kept.answer is None
    ingest.apply(Message("edge/v1/devices/cam-1/logs", answer("logs-1").to_payload(), False), 130.0)
    kept = store.log_request("logs-1")
    assert kept is not None and kept.answer == answer("logs-1")
