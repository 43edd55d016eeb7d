"""The MQTT topic tree of protocol v1.

Every device topic sits under ``edge/v1/devices/<device-id>/`` so broker ACLs can confine a
device to its own prefix; artifacts are shared by all devices of a wave under
``edge/v1/artifacts/<artifact-id>/``, and the controller's beacon (``edge/v1/fleet/beacon``,
edgecore/protocol/beacon.py) by every device. See docs/protocol.md for QoS and retain per topic.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from edgecore.errors import ProtocolError

__all__ = [
    "FLEET_BEACON",
    "ROOT",
    "DeviceTopic",
    "artifact_chunk",
    "artifact_chunks_filter",
    "device",
    "parse_artifact_chunk",
    "parse_device_topic",
    "validate_id",
]

ROOT = "edge/v1"

# Device-to-controller topics (the device publishes) and controller-to-device topics.
DEVICE_PUBLISHES = ("birth", "presence", "state", "events", "telemetry", "chunk-requests", "logs")
DEVICE_SUBSCRIBES = ("desired", "commands", "config")  # config: edgecore/protocol/device_config.py
# The controller's signed, retained proof that a broker is the fleet's: every device reads it, only the controller writes it.
FLEET_BEACON = f"{ROOT}/fleet/beacon"

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def validate_id(value: str, what: str = "device id") -> str:
    """Return ``value`` if it is a safe topic level: 1-64 of [A-Za-z0-9._-], not starting with . - _."""
    if not isinstance(value, str) or not _ID.match(value):
        raise ProtocolError(
            f"invalid {what} {value!r}: use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return value


def device(device_id: str, leaf: str) -> str:
    """Topic ``edge/v1/devices/<id>/<leaf>``; ``device_id`` may be ``+`` for a subscription filter."""
    if device_id != "+":
        validate_id(device_id)
    if leaf not in DEVICE_PUBLISHES + DEVICE_SUBSCRIBES:
        raise ProtocolError(f"unknown device topic leaf {leaf!r}")
    return f"{ROOT}/devices/{device_id}/{leaf}"


@dataclass(frozen=True)
class DeviceTopic:
    """A parsed device topic."""

    device_id: str
    leaf: str


def parse_device_topic(topic: str) -> DeviceTopic:
    """Parse ``edge/v1/devices/<id>/<leaf>``; raise ProtocolError for anything else."""
    parts = topic.split("/")
    if len(parts) != 5 or "/".join(parts[:3]) != f"{ROOT}/devices":
        raise ProtocolError(f"unexpected topic {topic!r}")
    validate_id(parts[3])
    if parts[4] not in DEVICE_PUBLISHES + DEVICE_SUBSCRIBES:
        raise ProtocolError(f"unexpected topic {topic!r}")
    return DeviceTopic(parts[3], parts[4])


def artifact_chunk(artifact_id: str, index: int) -> str:
    """Topic that carries chunk ``index`` of an artifact as raw bytes."""
    validate_id(artifact_id, "artifact id")
    return f"{ROOT}/artifacts/{artifact_id}/chunks/{index}"


def artifact_chunks_filter(artifact_id: str) -> str:
    """Subscription filter for every chunk of one artifact."""
    validate_id(artifact_id, "artifact id")
    return f"{ROOT}/artifacts/{artifact_id}/chunks/+"


def parse_artifact_chunk(topic: str) -> tuple[str, int]:
    """Return (artifact id, chunk index) of a chunk topic; raise ProtocolError otherwise."""
    parts = topic.split("/")
    if len(parts) != 6 or "/".join(parts[:3]) != f"{ROOT}/artifacts" or parts[4] != "chunks":
        raise ProtocolError(f"unexpected topic {topic!r}")
    validate_id(parts[3], "artifact id")
    if not parts[5].isdigit() or len(parts[5]) > 9:
        raise ProtocolError(f"bad chunk index in topic {topic!r}")
    return parts[3], int(parts[5])
