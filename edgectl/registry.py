"""The fleet as the broker knows it: each device's retained birth, presence and state messages."""

from __future__ import annotations

import logging
import queue
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from agent.errors import EdgeError
from agent.protocol import topics
from agent.protocol.messages import Presence, device_json
from agent.transport import Message, MqttTransport

__all__ = ["DeviceRecord", "collect_devices"]

log = logging.getLogger(__name__)


@dataclass
class DeviceRecord:
    device_id: str
    online: Optional[bool] = None
    last_seen: Optional[float] = None
    birth: dict[str, Any] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)

    def apply(self, leaf: str, payload: bytes) -> None:
        if leaf == "presence":
            presence = Presence.from_payload(payload)
            self.online = presence.online
            self.last_seen = max(self.last_seen or 0, presence.ts)
        elif leaf in ("birth", "state"):
            data = device_json(payload, leaf)
            setattr(self, leaf, data)
            self.last_seen = max(self.last_seen or 0, float(data.get("ts") or 0))

    def to_dict(self) -> dict[str, Any]:
        active = self.state.get("active") or {}
        return {
            "device_id": self.device_id,
            "status": "online" if self.online else "offline" if self.online is False else "unknown",
            "agent_version": self.birth.get("agent_version"),
            "target": self.birth.get("target"),
            "tags": self.birth.get("tags", {}),
            "model": active.get("name"),
            "version": active.get("version"),
            "backend": active.get("backend"),
            "deployment": self.state.get("deployment"),
            "inference_url": self.birth.get("inference_url"),
            "last_seen": self.last_seen,
        }


def collect_devices(transport: MqttTransport, inbox: "queue.Queue[Message]", settle_s: float = 0.5, max_s: float = 5.0) -> dict[str, DeviceRecord]:
    """Subscribe to the retained device topics and gather them until the flow settles."""
    for leaf in ("birth", "presence", "state"):
        transport.subscribe(topics.device("+", leaf), 1)
    devices: dict[str, DeviceRecord] = {}
    deadline = time.monotonic() + max_s
    while time.monotonic() < deadline:
        try:
            message = inbox.get(timeout=settle_s)
        except queue.Empty:
            break
        try:
            parsed = topics.parse_device_topic(message.topic)
            record = devices.setdefault(parsed.device_id, DeviceRecord(parsed.device_id))
            record.apply(parsed.leaf, message.payload)
        except EdgeError as exc:
            log.warning("ignored %s: %s", message.topic, exc)
    return devices
