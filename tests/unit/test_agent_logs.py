"""Remote logs on the agent: the ring's bounds, each redaction pattern, the answer's cap, and the signed command."""

from __future__ import annotations

import logging
import time

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agent.logs import LogRing
from agent.redaction import PATTERNS, REDACTED, redact
from edgecore.errors import ProtocolError
from edgecore.protocol.envelope import COMMAND_TYPE, sign
from edgecore.protocol.logs import MAX_ANSWER_BYTES, MAX_LINE_CHARS, MAX_LINES, LogAnswer, LogQuery
from edgecore.protocol.messages import Command
from tests.unit.test_agent_dispatch import DEVICE, RunningAgent, running  # noqa: F401  (the fixture)

SECRETS = [  # (pattern name, text, the secret that must not survive, what must)
    ("private key PEM block", "key: -----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIB7x\n-----END EC PRIVATE KEY----- ok",
     "MHcCAQEEIB7x", "ok"),
    ("URL credentials user:pass@", "connecting to mqtts://edge:hunter2@broker.lan:8883", "hunter2", "broker.lan:8883"),
    ("bearer token", "GET /x Authorization: Bearer eyJhbGciOiJFZERTQSJ9.e30.sig", "eyJhbGciOiJFZERTQSJ9", "Bearer"),
    ("value of a key named like token, secret, password or key",
     'settings {"api_token": "t0k3n", "client_secret": \'s3\', "tries": 3} password=pw1 private_key=/k.pem',
     "t0k3n", '"tries": 3'),
]


def record(logger: str, level: int, message: str, ts: float | None = None) -> logging.LogRecord:
    made = logging.LogRecord(logger, level, __file__, 1, message, None, None)
    if ts is not None:
        made.created = ts
    return made


@pytest.mark.parametrize(("name", "text", "secret", "kept"), SECRETS, ids=[s[0] for s in SECRETS])
def test_each_redaction_pattern_removes_its_secret_and_keeps_the_rest(name: str, text: str, secret: str, kept: str) -> None:
    pattern = next(p for n, p, _ in PATTERNS if n == name)
    assert pattern.search(text), "the pattern itself must match its example"
    out = redact(text)
    assert secret not in out and REDACTED in out and kept in out, out


def test_every_secret_of_the_key_value_rule_goes_and_an_unterminated_pem_block_goes_to_the_end() -> None:
    out = redact(SECRETS[3][1])
    assert not any(s in out for s in ("t0k3n", "s3", "pw1", "/k.pem")), out
    assert "ABCDEF" not in redact("-----BEGIN PRIVATE KEY-----\nABCDEF (cut short)")
    assert redact("controller keys now ed25519:ab12, key-rotation ok") == "controller keys now ed25519:ab12, key-rotation ok"


@pytest.mark.parametrize("shape", ["x", "ab.", "a=b ", "key", "http", "-----BEGIN "], ids=repr)
def test_redaction_stays_linear_on_long_hostile_lines(shape: str) -> None:
    """Every record is redacted as it is logged: a pattern that backtracks over a long word would stall the agent."""
    text = shape * (4 * MAX_LINE_CHARS // len(shape))  # the most a record brings (agent/logs.py cuts first)
    started = time.perf_counter()
    for _ in range(10):
        redact(text)
    assert time.perf_counter() - started < 0.5, f"10 redactions of {len(text)} characters of {shape!r}"


def test_ring_keeps_the_newest_records_within_its_line_and_byte_bounds_redacted_and_cut() -> None:
    ring = LogRing(max_lines=3, max_bytes=10_000)
    for i in range(5):
        ring.handle(record("agent", logging.INFO, f"line {i} password=pw{i}"))
    assert [line.message for line in ring.held()] == [f"line {i} password={REDACTED}" for i in (2, 3, 4)]
    ring = LogRing(max_lines=100, max_bytes=3000)
    ring.handle(record("agent", logging.INFO, "x" * 5000))
    ring.handle(record("agent", logging.INFO, "y" * 600))
    held = ring.held()
    assert len(held[0].message) == MAX_LINE_CHARS and held[0].message.endswith("…")
    ring.handle(record("agent", logging.INFO, "z" * 600))  # 2002 bytes ("…" is 3) + 600 + 600 > 3000: the oldest goes
    assert [line.message[0] for line in ring.held()] == ["y", "z"]


def test_answer_picks_last_lines_time_range_and_level_floor() -> None:
    ring = LogRing()
    for i in range(10):
        ring.handle(record("agent.x", logging.WARNING if i % 2 else logging.INFO, f"m{i}", ts=1000.0 + i))
    last = ring.answer(DEVICE, LogQuery("r-1", lines=3))
    assert [line.message for line in last.lines] == ["m7", "m8", "m9"] and not last.truncated
    assert last.held_since == 1000.0 and last.request_id == "r-1"
    ranged = ring.answer(DEVICE, LogQuery("r-2", lines=MAX_LINES, since=1002.0, until=1005.0, level="WARNING"))
    assert [line.message for line in ranged.lines] == ["m3", "m5"]


def test_answer_fits_the_byte_cap_keeping_the_newest_and_says_truncated() -> None:
    ring = LogRing()
    for i in range(200):
        ring.handle(record("agent", logging.INFO, f"{i:04d}" + "x" * 1000, ts=float(i)))
    answer = ring.answer(DEVICE, LogQuery("r-1", lines=MAX_LINES))
    payload = answer.to_payload()
    assert len(payload) <= MAX_ANSWER_BYTES and answer.truncated
    assert answer.lines[-1].message.startswith("0199") and 40 < len(answer.lines) < 200
    assert LogAnswer.from_payload(payload) == answer


@pytest.mark.parametrize(("args", "field"), [
    ({"lines": 5}, "logs: missing field 'request_id'"),
    ({"request_id": "r", "lines": MAX_LINES + 1}, "logs.lines"),
    ({"request_id": "r", "lines": 0}, "logs.lines"),
    ({"request_id": "r", "level": "LOUD"}, "logs.level"),
    ({"request_id": "r", "since": 10, "until": 5}, "logs.since"),
    ({"request_id": "../x"}, "logs.request_id"),
])
def test_query_out_of_bounds_is_refused_naming_the_field(args: dict[str, object], field: str) -> None:
    with pytest.raises(ProtocolError, match=field.replace(".", r"\.")):
        LogQuery.from_args(args)


def test_signed_logs_command_is_answered_redacted_on_the_logs_topic(running: RunningAgent) -> None:  # noqa: F811
    logging.getLogger("agent.test").warning("upstream https://u:hunter2@x.lan token=abc123")
    running.send("commands", running.command("logs", LogQuery("req-1", lines=50, level="WARNING").to_args()))
    answer = LogAnswer.from_payload(running.next("logs").payload)
    assert answer.request_id == "req-1" and answer.device_id == DEVICE
    assert all(line.level in ("WARNING", "ERROR", "CRITICAL") for line in answer.lines)
    text = "\n".join(line.message for line in answer.lines)
    assert "upstream https://[REDACTED]@x.lan token=[REDACTED]" in text and "hunter2" not in text


def test_forged_oversized_and_out_of_bounds_logs_requests_are_refused_and_the_agent_keeps_going(
        running: RunningAgent) -> None:  # noqa: F811
    now = time.time()
    forged = sign(COMMAND_TYPE, Command(DEVICE, running.seq + 100, now, now + 60, "logs", {"request_id": "f"}).to_payload(),
                  Ed25519PrivateKey.generate()).to_bytes()
    too_many = running.command("logs", {"request_id": "big", "lines": MAX_LINES + 1})
    oversized = running.command("logs", {"request_id": "huge", "pad": "x" * (1024 * 1024)})
    for payload in (forged, too_many, oversized):
        running.send("commands", payload)
        assert running.event().status == "rejected"
    running.send("commands", running.command("logs", LogQuery("ok").to_args()))
    assert LogAnswer.from_payload(running.next("logs").payload).request_id == "ok"
    assert sum(running.agent.rejected.values()) == 3
