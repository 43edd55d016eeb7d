"""A rollout driven in process: a real SQLite store, the real planner, submit path and engine, a hand-moved clock.

The engine's one seam to the devices is its :class:`Publisher`; :class:`Recorder` takes its place
and records what would be sent. Devices answer by events, as their reports would arrive.
The package is real (a manifest built in code and signed), only its payload file is a stand-in:
nothing here downloads it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgecore.protocol.envelope import DESIRED_TYPE, MANIFEST_TYPE, sign
from edgecore.protocol.manifest import FileEntry, Manifest, PayloadInfo, TargetInfo
from edgecore.protocol.reports import DeviceEvent
from edgecore.protocol.schema import encode_json
from edgectl.controller.engine import Engine
from edgectl.controller.planner import plan_rollout
from edgectl.controller.records import DeviceStatus, Phase, RolloutDevice, RolloutRow, RolloutStatus
from edgectl.controller.sets import SetMessage
from edgectl.controller.store import SqliteStore
from edgectl.controller.submit import RolloutOptions, submit_rollout
from edgectl.package import Package

__all__ = ["Recorder", "RolloutBench", "signed_package"]


class Recorder:
    """The engine's Publisher seam: records what it would send (a desired state with no model is a cancel)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []
        self.key = Ed25519PrivateKey.generate()
        self.seq = 0

    def desired(self, device_id: str, message: SetMessage) -> bytes:
        self.sent.append(("desired" if message.entries else "cancel", device_id))
        self.seq += 1  # the engine reads the sequence number of what it sent (the newest set of a device wins)
        return sign(DESIRED_TYPE, encode_json({"seq": self.seq}), self.key).to_bytes()

    def rollback(self, rollout: RolloutRow, device_id: str, message: SetMessage) -> tuple[bool, bytes]:
        self.sent.append(("rollback", device_id))
        return True, self.desired(device_id, message)

    def send(self, device_id: str, leaf: str, payload: bytes) -> bool:
        return True

    def expect(self, rollout: RolloutRow, rows: list[RolloutDevice]) -> None:
        pass


def signed_package(folder: Path, name: str = "clf", version: int = 2) -> Package:
    """A package whose manifest is real and signed; its payload file is a stand-in of the stated size."""
    payload = folder / f"{name}-{version}.payload"
    payload.write_bytes(b"p" * 2048)
    sha = hashlib.sha256(payload.read_bytes()).hexdigest()
    chunk = hashlib.sha256(b"p" * 1024).hexdigest()
    manifest = Manifest(name, version, 1.0, 4e9, "0.1", TargetInfo("any"), PayloadInfo(2048, sha, 1024, (chunk, chunk)),
                        (FileEntry("model.onnx", 2048, sha, "model"),), "model.onnx", (), ())
    envelope = sign(MANIFEST_TYPE, manifest.to_bytes(), Ed25519PrivateKey.generate())
    path = folder / f"{name}-{version}.edgepkg"
    path.write_bytes(envelope.to_bytes())
    return Package(path, envelope, manifest, payload)


class RolloutBench:
    """Online devices ``d0..dN-1`` (and offline ones when asked), one rollout submitted as an operator would."""

    def __init__(self, folder: Path, devices: int, offline: int = 0) -> None:
        self.now = 1000.0
        self.folder = folder
        self.store = SqliteStore(folder / "store.db")
        self.publisher = Recorder()
        self.engine = Engine(self.store, self.publisher, lambda _target, _backend: None, clock=lambda: self.now)
        self.online = [f"d{i}" for i in range(devices)]
        self.offline = [f"off{i}" for i in range(offline)]
        for device in self.online:
            self.store.upsert_device(device, online=1, last_seen=self.now)
        for device in self.offline:
            self.store.upsert_device(device, online=0, last_seen=self.now - 3600)
        self.rollout_id = ""

    def submit(self, max_failure: float, gates: Sequence[str] = (), waves: str = "100%", bake_s: float = 0.0) -> str:
        rows = [{"device_id": d, "target": "any", "status": "online"} for d in self.online]
        rows += [{"device_id": d, "target": "any", "status": "offline"} for d in self.offline]
        plan = plan_rollout(rows, [signed_package(self.folder)], waves, bake_s)
        options = RolloutOptions("all", max_failure, bake_s, list(gates), wave_timeout_s=300.0)
        self.rollout_id = submit_rollout(self.store, plan, options)
        return self.rollout_id

    def rollout(self) -> RolloutRow:
        row = self.store.rollout(self.rollout_id)
        assert row is not None
        return row

    def rows(self) -> dict[str, RolloutDevice]:
        return {r.device_id: r for r in self.store.rollout_devices(self.rollout_id)}

    def report(self, device: str, status: str, state: str = "done") -> None:
        self.engine.reports.on_event(device, DeviceEvent(device, self.rollout_id, state, status, "", self.now))

    def tick(self) -> tuple[RolloutStatus, Phase]:
        self.engine.tick()
        rollout = self.rollout()
        return rollout.status, rollout.phase

    def in_flight(self) -> list[str]:
        return [d for d, r in self.rows().items() if r.status in (DeviceStatus.SENT, DeviceStatus.RUNNING)]
