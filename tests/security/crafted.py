"""Crafted controller messages and a raw MQTT observer for the command and hostile-input tests.

The tests play the attacker and the controller with a plain paho client: they sign (or do not
sign) exactly the bytes they want, with the sequence numbers and expiries they choose.
"""

from __future__ import annotations

import json
import queue
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from paho.mqtt.enums import CallbackAPIVersion

from edgecore.protocol.envelope import COMMAND_TYPE, DESIRED_TYPE, Envelope, TrustedKeys, sign
from edgecore.protocol.messages import Command, DesiredModel, DesiredState
from edgectl.examples import tiny_classifier
from edgectl.keys import Keyring
from edgectl.package import BuildOptions, Package, build_package, read_package
from tests.fleet import EdgectlHome, wait_for

__all__ = ["Observer", "command", "controller_key", "desired", "make_package", "sparse_tar"]


def controller_key(home: EdgectlHome) -> Ed25519PrivateKey:
    return Keyring(root=home.path / "keys").signing_key("controller")


def make_package(home: EdgectlHome, workdir: Path, name: str, version: int, seed: int = 0,
                 chunk_size: int = 64 * 1024) -> Package:
    """A signed package of a tiny classifier, built and reopened as edgectl does."""
    workdir.mkdir(parents=True, exist_ok=True)
    keys = Keyring(root=home.path / "keys")
    model = tiny_classifier(workdir / f"{name}-{version}.onnx", seed=seed)
    out = workdir / f"{name}-{version}.edgepkg"
    build_package(model, BuildOptions(name, version, chunk_size=chunk_size), keys.signing_key("package"), out)
    trusted = TrustedKeys([keys.signing_key("package").public_key()])
    (workdir / f"open-{version}").mkdir(exist_ok=True)
    return read_package(out, trusted, workdir / f"open-{version}")


def sparse_tar(path: Path, members: dict[str, bytes], sparse_name: str, logical_size: int) -> Path:
    """An uncompressed tar of ``members`` plus one GNU sparse member: 512 stored bytes at the end of a
    ``logical_size`` hole. A few KB on disk; a reader that honours the sparse map writes ``logical_size`` bytes."""
    with path.open("wb") as out:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            out.write(info.tobuf(tarfile.GNU_FORMAT))
            out.write(data + b"\0" * (-len(data) % 512))
        out.write(_sparse_header(sparse_name, logical_size))
        out.write(b"x" * 512)
        out.write(b"\0" * 1024)
    return path


def _sparse_header(name: str, logical_size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = 512
    info.type = tarfile.GNUTYPE_SPARSE
    header = bytearray(info.tobuf(tarfile.GNU_FORMAT)[:512])
    header[386:410] = _octal(logical_size - 512) + _octal(512)  # one sparse entry: (offset, length)
    header[482:483] = b"\0"  # no extended sparse headers
    header[483:495] = _octal(logical_size)  # the real size
    header[148:156] = b" " * 8
    header[148:156] = f"{sum(header):06o}".encode() + b"\0 "
    return bytes(header)


def _octal(number: int) -> bytes:
    return f"{number:011o}".encode() + b"\0"


def desired(key: Ed25519PrivateKey | None, device_id: str, seq: int, package: Package | None = None,
            expires_in: float = 3600.0, deployment_id: str = "d-test") -> bytes:
    """A desired-state envelope; ``key`` None gives an envelope with no signature at all."""
    now = time.time()
    model = None if package is None else DesiredModel(package.manifest.name, package.manifest.version, package.envelope)
    payload = DesiredState(device_id, seq, now, now + expires_in, deployment_id, model).to_payload()
    return _envelope(DESIRED_TYPE, payload, key)


def command(key: Ed25519PrivateKey | None, device_id: str, seq: int, name: str = "report",
            expires_in: float = 3600.0) -> bytes:
    now = time.time()
    payload = Command(device_id, seq, now, now + expires_in, name, {}).to_payload()
    return _envelope(COMMAND_TYPE, payload, key)


def _envelope(payload_type: str, payload: bytes, key: Ed25519PrivateKey | None) -> bytes:
    if key is None:
        return Envelope(payload_type, payload, ()).to_bytes()
    return sign(payload_type, payload, key).to_bytes()


@dataclass
class Observer:
    """A raw paho client that publishes crafted bytes and records a device's events and telemetry."""

    client: mqtt.Client
    device_id: str
    inbox: queue.Queue[mqtt.MQTTMessage] = field(default_factory=queue.Queue)
    events: list[dict[str, Any]] = field(default_factory=list)
    telemetry: list[dict[str, Any]] = field(default_factory=list)
    others: list[tuple[str, bytes, bool]] = field(default_factory=list)  # (topic, payload, retained)

    @classmethod
    def connect(cls, port: int, device_id: str) -> Observer:
        client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"observer-{device_id}-{time.monotonic_ns()}")
        observer = cls(client, device_id)
        client.on_message = lambda _c, _u, msg: observer.inbox.put(msg)
        client.connect("127.0.0.1", port)
        client.loop_start()
        for leaf in ("events", "telemetry"):
            client.subscribe(f"edge/v1/devices/{device_id}/{leaf}", qos=1)
        return observer

    def publish(self, topic: str, payload: bytes, retain: bool = False) -> None:
        info = self.client.publish(topic, payload, qos=1, retain=retain)
        info.wait_for_publish(timeout=10)
        assert info.is_published(), f"the broker did not take {topic}"

    def _drain(self) -> None:
        while True:
            try:
                msg = self.inbox.get_nowait()
            except queue.Empty:
                return
            if msg.topic.endswith("/events"):
                self.events.append(json.loads(msg.payload))
            elif msg.topic.endswith("/telemetry"):
                self.telemetry.append(json.loads(msg.payload))
            else:
                self.others.append((msg.topic, bytes(msg.payload), bool(msg.retain)))

    def retained(self, topic: str, timeout: float = 30) -> bytes:
        """Subscribe to ``topic`` and return the message retained there (or published there meanwhile)."""
        self.client.subscribe(topic, qos=1)

        def found() -> bytes | None:
            self._drain()
            return next((p for t, p, _ in self.others if t == topic), None)

        message: bytes = wait_for(found, timeout, f"the retained message on {topic}")
        return message

    def rejected_events(self) -> list[dict[str, Any]]:
        self._drain()
        return [e for e in self.events if e["status"] == "rejected"]

    def other_events(self) -> list[dict[str, Any]]:
        self._drain()
        return [e for e in self.events if e["status"] != "rejected"]

    def rejected_count(self) -> int:
        """The agent's own count of rejected messages, from its latest telemetry."""
        self._drain()
        return sum(self.telemetry[-1]["rejected_messages"].values()) if self.telemetry else 0

    def wait_rejected(self, events: int, counted: int, timeout: float = 30) -> None:
        wait_for(lambda: len(self.rejected_events()) >= events, timeout, f"{events} rejected event(s)")
        wait_for(lambda: self.rejected_count() >= counted, timeout, f"telemetry counting {counted} rejected")

    def settle(self, reports: int = 2, timeout: float = 30) -> None:
        """Wait for ``reports`` more telemetry reports: the agent's loop has handled what came before."""
        self._drain()
        target = len(self.telemetry) + reports

        def reported() -> bool:
            self._drain()
            return len(self.telemetry) >= target

        wait_for(reported, timeout, f"{reports} telemetry reports")

    def reset(self) -> None:
        """Forget what was recorded so far (after a deployment whose events do not matter)."""
        self.settle(1)
        self.events.clear()

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()
