"""Remote logs through the REST API and the CLI: a real agent on a real Mosquitto, the controller in between."""

from __future__ import annotations

import json
import queue
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any

from edgecore.protocol import topics
from edgecore.protocol.logs import MAX_LINES, LogAnswer
from edgecore.transport import Message, MqttTransport
from edgectl.controller.store import open_url
from tests.api.conftest import ApiPlane
from tests.fleet import AgentProcess, wait_for

LOGS = "/api/v1/devices/{}/logs"


def _requests(plane: ApiPlane) -> int:
    with sqlite3.connect(plane.store_url) as db:
        return int(db.execute("SELECT COUNT(*) FROM log_requests").fetchone()[0])


def _device(plane: ApiPlane, device_id: str) -> None:
    """A device the store knows that no agent answers for."""
    store = open_url(plane.store_url, packages_dir=plane.home.path / "packages")
    try:
        store.upsert_device(device_id, last_seen=time.time())
    finally:
        store.close()


def test_a_real_agent_answers_through_the_api_and_the_cli_and_get_returns_the_latest(api: ApiPlane, tmp_path: Path) -> None:
    agent = AgentProcess("cam-logs", tmp_path / "agent", api.broker.url, [api.home.public_key("package")],
                         [api.home.public_key("controller")]).start()
    try:
        wait_for(lambda: api.call("GET", "/api/v1/devices/cam-logs").status == 200, 30, "the agent in the store")
        started = time.monotonic()
        answer = api.call("POST", LOGS.format("cam-logs"), {"lines": 20, "level": "INFO"})
        took = time.monotonic() - started
        assert answer.status == 200, answer.body
        body: dict[str, Any] = answer.body
        messages = [line["message"] for line in body["lines"]]
        assert any("inference API on" in m for m in messages), messages
        assert 0 < len(messages) <= 20 and body["truncated"] is False and body["held_since"] is not None
        assert all(line["level"] != "DEBUG" for line in body["lines"]) and body["actor"] == "api:operator-user"
        assert took < 5.0, f"answered in {took:.1f}s"  # the leader sends on its next tick (0.5 s)
        latest = api.call("GET", LOGS.format("cam-logs"))
        assert latest.status == 200 and latest.body["request_id"] == body["request_id"]
        shown = api.edgectl("device", "logs", "cam-logs", "--lines", "3", "--json", check=True)
        assert len(json.loads(shown.stdout)["lines"]) == 3
        printed = api.edgectl("device", "logs", "cam-logs", "--level", "info", check=True).stdout
        assert "inference API on" in printed and "line(s) from cam-logs; it holds records since" in printed
    finally:
        agent.stop()


BAD = [  # (body, the field the 400 names)
    ({"lines": 0}, "lines"),
    ({"lines": MAX_LINES + 1}, "lines"),
    ({"lines": "ten"}, "lines"),
    ({"level": "LOUD"}, "level"),
    ({"since": 20, "until": 10}, "since"),
    ({"wait_s": 600}, "wait_s"),
    ({"colour": "red"}, "colour"),
]


def test_bad_bodies_unknown_silent_and_unfetched_devices_and_hostile_answers(api: ApiPlane) -> None:
    """One controller for the cases that need no agent (a controller start costs more than the cases)."""
    _device(api, "cam-quiet")
    for body, field in BAD:
        answer = api.call("POST", LOGS.format("cam-quiet"), body)
        assert answer.status == 400 and answer.body["error"]["field"] == field, (body, answer.body)
    assert _requests(api) == 0, "a refused request must store (and send) nothing"

    unknown = api.call("POST", LOGS.format("cam-none"), {})
    assert unknown.status == 404 and unknown.body["error"]["field"] == "device_id" and _requests(api) == 0
    never = api.call("GET", LOGS.format("cam-quiet"))
    assert never.status == 404 and "no logs of device 'cam-quiet' were fetched yet" in never.body["error"]["message"]
    silent = api.call("POST", LOGS.format("cam-quiet"), {"wait_s": 1})
    assert silent.status == 504, silent.body
    assert "no answer from cam-quiet within 1s after the request was sent" in silent.body["error"]["message"]
    assert api.call("GET", LOGS.format("cam-quiet")).status == 404  # still nothing: unanswered is not empty
    bad = api.edgectl("device", "logs", "cam-quiet", "--level", "LOUD")
    assert bad.returncode == 2 and "--level: 'LOUD' is not one of DEBUG" in bad.stderr, bad.stderr
    quiet = api.edgectl("device", "logs", "cam-quiet", "--wait", "1")
    assert quiet.returncode == 5 and "no answer from cam-quiet within 1s after the request was sent" in quiet.stderr

    inbox: queue.Queue[Message] = queue.Queue()
    rogue = MqttTransport(api.broker.url, f"rogue-{uuid.uuid4().hex[:6]}", inbox=inbox)
    rogue.connect()
    try:
        topic = topics.device("cam-quiet", "logs")
        assert rogue.publish(topic, b'{"schema": 1, "device_id": "cam-quiet", "lines": "x"}', qos=1, wait=5.0)
        unasked = LogAnswer("cam-quiet", "logs-made-up", time.time(), (), False, None)
        assert rogue.publish(topic, unasked.to_payload(), qos=1, wait=5.0)
    finally:
        rogue.close()

    def dropped() -> bool:
        text = api.call("GET", "/metrics", token="viewer").body.decode()
        return all(f'edgectl_dropped_messages_total{{reason="{r}"}} 1.0' in text for r in ("malformed-logs", "unasked-logs"))

    wait_for(dropped, 20, "both answers dropped and counted")
    assert api.call("GET", LOGS.format("cam-quiet")).status == 404
