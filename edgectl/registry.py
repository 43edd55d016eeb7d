"""The fleet as the broker knows it: each device's retained birth, presence and state messages."""

from __future__ import annotations

import logging
import math
import queue
import time
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from agent.errors import EdgeError
from agent.protocol import topics
from agent.protocol.messages import ChunkRequest, DeviceEvent, Presence, device_json
from agent.transport import Message, MqttTransport
from edgectl.controller.history import telemetry_point
from edgectl.controller.inbox import Drops
from edgectl.controller.records import DeviceRow
from edgectl.controller.store import Store

__all__ = ["DeviceRecord", "EventReport", "Ingest", "LiveBirth", "Report", "StateReport", "collect_devices"]

# Latency and telemetry history keep one telemetry point per device per this many seconds.
LATENCY_EVERY_S = 5.0

log = logging.getLogger(__name__)


@dataclass
class DeviceRecord:
    device_id: str
    online: bool | None = None
    last_seen: float | None = None
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

    @classmethod
    def from_row(cls, row: DeviceRow) -> DeviceRecord:
        return cls(row.id, row.online, row.last_seen, row.birth, row.state)

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


def collect_devices(transport: MqttTransport, inbox: queue.Queue[Message], settle_s: float = 0.5,
                    max_s: float = 5.0) -> dict[str, DeviceRecord]:
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


@dataclass(frozen=True)
class EventReport:
    """A deployment event, about the device its topic names."""

    device_id: str
    event: DeviceEvent


@dataclass(frozen=True)
class StateReport:
    """A device's retained state, for catching up on reports missed while the controller was down."""

    device_id: str
    state: dict[str, Any]


@dataclass(frozen=True)
class LiveBirth:
    """A live (not retained) birth: the device connected just now."""

    device_id: str


Report = EventReport | StateReport | LiveBirth


class Ingest:
    """Writes what devices publish into the controller's store; returns what the rollouts must see.

    A device is who its topic says: the broker's ACL binds ``edge/v1/devices/<id>/...`` to the
    certificate whose CN is ``<id>``. A body that names another device is dropped before anything
    is stored and counted in ``drops`` as ``identity``."""

    def __init__(self, store: Store, drops: Drops | None = None) -> None:
        self.store = store
        self.drops = drops or Drops()
        self._latency_at: dict[str, float] = {}

    def apply(self, message: Message) -> EventReport | StateReport | None:
        """Store one device message; return what the rollouts must see (events, retained state)."""
        parsed = topics.parse_device_topic(message.topic)
        device_id, leaf, now = parsed.device_id, parsed.leaf, time.time()
        body = _parse(leaf, message.payload)
        if not self.same_device(message.topic, device_id, body):
            return None
        if isinstance(body, Presence):
            last_seen = max(body.ts, now if body.online else 0)
            self.store.upsert_device(device_id, online=int(body.online), last_seen=last_seen)
        elif isinstance(body, DeviceEvent):
            self.store.add_event(device_id, body.ts, body.deployment_id, body.state, body.status, body.detail, body.data)
            self.store.upsert_device(device_id, last_seen=now)
            return EventReport(device_id, body)
        elif isinstance(body, ChunkRequest):
            pass  # the artifact server answers these (Controller._drain)
        elif leaf == "birth":
            self.store.upsert_device(device_id, birth=body, last_seen=now, birth_at=_report_ts(body, now))
        elif leaf == "state":
            self.store.upsert_device(device_id, state=body, last_seen=now, state_at=_report_ts(body, now))
            return StateReport(device_id, body)
        elif leaf == "telemetry":
            self._telemetry(device_id, body, now)
        return None

    def same_device(self, topic: str, device_id: str, body: Presence | DeviceEvent | ChunkRequest | dict[str, Any]) -> bool:
        """Whether the body names the device its topic names; counts the drop when not."""
        named = body.get("device_id") if isinstance(body, dict) else body.device_id
        if named == device_id:
            return True
        self.drops.count("identity", topic, f"the body names device {str(named)[:64]!r}")
        return False

    def chunk_request_from_its_device(self, message: Message) -> bool:
        """A chunk request names the device asking: it must be the one its topic names."""
        device_id = topics.parse_device_topic(message.topic).device_id
        return self.same_device(message.topic, device_id, ChunkRequest.from_payload(message.payload))

    def _telemetry(self, device_id: str, report: dict[str, Any], now: float) -> None:
        self.store.upsert_device(device_id, telemetry=report, telemetry_ts=now, last_seen=now, online=1,
                                 telemetry_at=_report_ts(report, now))
        if now - self._latency_at.get(device_id, 0.0) < LATENCY_EVERY_S:
            return
        self._latency_at[device_id] = now
        self.store.add_telemetry(telemetry_point(device_id, report, _report_ts(report, now)))
        models = report.get("models")
        for name, stats in (models.items() if isinstance(models, dict) else ()):
            latency = stats.get("latency_ms") if isinstance(stats, dict) else None
            p95 = latency.get("p95") if isinstance(latency, dict) else None
            if _finite_number(p95) and str(stats.get("version", "")).isdigit():
                self.store.add_latency(device_id, name, int(stats["version"]), float(p95), "telemetry", now)


def _parse(leaf: str, payload: bytes) -> Presence | DeviceEvent | ChunkRequest | dict[str, Any]:
    if leaf == "presence":
        return Presence.from_payload(payload)
    if leaf == "events":
        return DeviceEvent.from_payload(payload)
    if leaf == "chunk-requests":
        return ChunkRequest.from_payload(payload)
    return device_json(payload, leaf)


def _report_ts(body: dict[str, Any], now: float) -> float:
    """The device's own time of a report: what orders reports that replicas ingest out of order."""
    ts = body.get("ts")
    return float(ts) if _finite_number(ts) else now


def _finite_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
