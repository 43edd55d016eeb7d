"""A real edge-agent process on a real Mosquitto takes its signed configuration: the retained one at connect, refuses an
invalid one and a replay with their reasons (the old one stays), and keeps what it applied across a restart."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgecore.protocol import topics
from edgecore.protocol.device_config import CONFIG_TYPE
from edgecore.protocol.envelope import sign
from edgecore.protocol.reports import Birth, DeviceEvent, DeviceState
from edgecore.protocol.schema import encode_json
from edgecore.transport import Message, MqttTransport
from tests.brokers import BrokerProcess
from tests.fleet import AgentProcess

DEVICE = "cam-cfg"
WAIT_S = 30.0  # a bound on waiting, not a timing claim
READERS: dict[str, Callable[[bytes], Any]] = {"state": DeviceState.from_payload, "events": DeviceEvent.from_payload,
                                              "birth": Birth.from_payload}


def _signed(key: Ed25519PrivateKey, version: int, settings: dict[str, Any]) -> bytes:
    now = time.time()
    body = {"type": "config", "device_id": DEVICE, "version": version, "issued_at": now, "expires_at": now + 600,
            "settings": settings}
    return sign(CONFIG_TYPE, encode_json(body), key).to_bytes()


class Reports:
    """Everything the device published since the test subscribed, searched from a mark on."""

    def __init__(self, inbox: queue.Queue[Message]) -> None:
        self.inbox = inbox
        self.seen: list[Message] = []

    def mark(self) -> int:
        return len(self.seen)

    def find(self, leaf: str, until: Any, since: int = 0) -> Any:
        """The first report on ``leaf`` at or after ``since`` for which ``until(report)`` holds."""
        deadline = time.monotonic() + WAIT_S
        index = since
        while True:
            while index >= len(self.seen):
                self.seen.append(self.inbox.get(timeout=max(0.0, deadline - time.monotonic())))
            message, index = self.seen[index], index + 1
            if message.topic == topics.device(DEVICE, leaf):
                report = READERS[leaf](message.payload)
                if until(report):
                    return report


def test_retained_invalid_replayed_and_restart(mosquitto: BrokerProcess, tmp_path: Path) -> None:
    key = Ed25519PrivateKey.generate()
    pem = tmp_path / "controller.pem"
    pem.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    inbox: queue.Queue[Message] = queue.Queue()
    controller = MqttTransport(mosquitto.url, "test-controller", inbox=inbox)
    controller.connect()
    controller.subscribe(f"{topics.ROOT}/devices/{DEVICE}/#", 1)
    reports = Reports(inbox)
    config_topic = topics.device(DEVICE, "config")
    assert controller.publish(config_topic, _signed(key, 1, {"tags": {"line": "3"}, "telemetry_interval_s": 2}),
                              retain=True, wait=5.0)
    agent = AgentProcess(DEVICE, tmp_path / "agent", mosquitto.url, [pem], [pem], extra={"tags": {"site": "lab"}}).start()
    try:
        state = reports.find("state", lambda s: s.config is not None)
        assert (state.config.version, state.config.status.value, state.config.applied_version) == (1, "applied", 1)
        assert reports.find("birth", lambda b: "line" in b.tags).tags == {"site": "lab", "line": "3"}

        since = reports.mark()
        assert controller.publish(config_topic, _signed(key, 2, {"log_level": "CHATTY"}), retain=True, wait=5.0)
        event = reports.find("events", lambda e: e.state == "config", since)
        assert event.status == "refused" and "settings.log_level" in event.detail
        state = reports.find("state", lambda s: s.config is not None and s.config.version == 2, since)
        assert (state.config.status.value, state.config.applied_version) == ("refused", 1)

        assert controller.publish(config_topic, _signed(key, 1, {"telemetry_interval_s": 60}), wait=5.0)  # a replay
        event = reports.find("events", lambda e: e.status == "rejected", since)
        assert "version 1 <= last handled 2" in event.detail

        agent.stop()
        since = reports.mark()
        agent.start()  # the retained version 2 comes back: handled already, nothing new; version 1 is still in force
        birth = reports.find("birth", lambda b: True, since)
        assert birth.tags == {"site": "lab", "line": "3"}
        state = reports.find("state", lambda s: s.ts is not None and s.ts >= (birth.ts or 0), since)
        assert state.config is not None and (state.config.version, state.config.applied_version) == (2, 1)
    finally:
        agent.stop()
        controller.close()
    assert "unexpected topic" not in agent.log_text()
