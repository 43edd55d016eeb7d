"""An in-process controller for deploy tests: crafts and signs desired states, serves chunks, records events.

It is the publisher the tests use to send both honest and hostile messages (tampered manifests,
unknown keys, stale sequence numbers) to real agent processes through a real broker.
"""

from __future__ import annotations

import dataclasses
import queue
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgecore.protocol import topics
from edgecore.protocol.envelope import DESIRED_TYPE, MANIFEST_TYPE, Envelope, TrustedKeys, sign
from edgecore.protocol.manifest import Manifest
from edgecore.protocol.messages import DeployOptions, DesiredModel, DesiredSet, DesiredState
from edgecore.protocol.reports import ChunkRequest, DeviceEvent
from edgecore.transport import Message, MqttTransport
from edgecore.windows import Maintenance
from edgectl.artifacts.chunk_server import ArtifactServer, ServedArtifact
from edgectl.keys import Keyring
from edgectl.package import BuildOptions, Package, build_package, read_package
from tests.fleet import AgentProcess, EdgectlHome, wait_for
from tests.pump import InboxPump

__all__ = ["Controller", "PausableAgent", "replace", "resign_manifest"]


def resign_manifest(package: Package, key: Ed25519PrivateKey, change: Callable[[Manifest], Manifest] = lambda m: m,
                    payload_type: str = MANIFEST_TYPE) -> Envelope:
    """A manifest envelope with ``change`` applied, signed by ``key``: how an attacker would craft one."""
    return sign(payload_type, change(package.manifest).to_bytes(), key)


class Controller:
    """Publishes desired states signed with the home's controller key, answers chunk requests, logs events."""

    def __init__(self, home: EdgectlHome, workdir: Path) -> None:
        self.home = home
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.ring = Keyring(home.path / "keys")
        self.inbox: queue.Queue[Message] = queue.Queue()
        self.transport = MqttTransport(home.broker_url, f"test-ctl-{uuid.uuid4().hex[:8]}", inbox=self.inbox)
        self.transport.subscribe(topics.device("+", "events"), 1)
        self.server = ArtifactServer(self.transport, gather_s=0.05)
        self.serving = True  # False: chunk requests are recorded but not answered
        self.requests: list[bytes] = []
        self.events: list[DeviceEvent] = []
        self._seq = int(time.time() * 1000)
        self.transport.connect()
        self.server.start()
        self._pump = InboxPump(self.inbox, self._handle)

    def close(self) -> None:
        self._pump.close()
        self.server.stop()
        self.transport.close()

    def _handle(self, message: Message) -> None:
        if message.topic.endswith("/chunk-requests"):
            self.requests.append(message.payload)
            if self.serving:
                self.server.handle_request(ChunkRequest.from_payload(message.payload))
        elif message.topic.endswith("/events"):
            self.events.append(DeviceEvent.from_payload(message.payload))

    # -- packages ---------------------------------------------------------------------------------

    def package(self, model: Path, name: str, version: int, **options: Any) -> Package:
        """Build and open a signed package with the home's package key, and serve its chunks."""
        out = self.workdir / f"{name}-{version}-{uuid.uuid4().hex[:4]}.edgepkg"
        build_package(model, BuildOptions(name, version, **options), self.ring.signing_key("package"), out)
        unpacked = self.workdir / out.stem
        unpacked.mkdir()
        package = read_package(out, TrustedKeys([self.ring.signing_key("package").public_key()]), unpacked)
        self.serve(package)
        return package

    def serve(self, package: Package) -> None:
        m = package.manifest
        self.server.serve(ServedArtifact(m.artifact_id, package.payload, m.payload.chunk_size, len(m.payload.chunks)))

    # -- desired states ---------------------------------------------------------------------------

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def desired(self, device_id: str, package: Package | None, *, manifest: Envelope | None = None,
                seq: int | None = None, key: Ed25519PrivateKey | None = None, deployment_id: str | None = None,
                name: str | None = None, version: int | None = None, **options: Any) -> str:
        """Publish a signed (retained) desired state; every part can be overridden to craft attacks."""
        deployment_id = deployment_id or f"d-{uuid.uuid4().hex[:10]}"
        model = None
        if package is not None:
            model = DesiredModel(name or package.manifest.name, version or package.manifest.version,
                                 manifest or package.envelope)
        now = time.time()
        state = DesiredState(device_id, seq or self.next_seq(), now, now + 3600, deployment_id, model, options)
        envelope = sign(DESIRED_TYPE, state.to_payload(), key or self.ring.signing_key("controller"))
        self.publish(topics.device(device_id, "desired"), envelope.to_bytes(), retain=True)
        return deployment_id

    def desired_set(self, device_id: str, models: Sequence[tuple[Package, str]],
                    pipelines: Sequence[tuple[Package, str]] = (), *, seq: int | None = None,
                    deployment_id: str | None = None, allow_downgrade: bool = False,
                    shadow: dict[str, float] | None = None,
                    maintenance: Maintenance | Mapping[str, Maintenance] | None = None) -> str:
        """Publish a signed (retained) schema 2 desired set: each package with the deployment id that put it there.

        ``shadow``: the agreement a shadow run of that name must reach; ``maintenance``: every entry's windows and
        deadline, or those of each model named. Returns the set's deployment id."""
        deployment_id = deployment_id or f"s-{uuid.uuid4().hex[:10]}"

        def entry(package: Package, entry_id: str) -> DesiredModel:
            m = package.manifest
            windows = maintenance.get(m.name) if isinstance(maintenance, Mapping) else maintenance
            options = DeployOptions(allow_downgrade, (shadow or {}).get(m.name), windows)
            return DesiredModel(m.name, m.version, package.envelope, (), entry_id, options)

        now = time.time()
        state = DesiredSet(device_id, seq or self.next_seq(), now, now + 3600, deployment_id,
                           tuple(entry(p, i) for p, i in models), tuple(entry(p, i) for p, i in pipelines))
        envelope = sign(DESIRED_TYPE, state.to_payload(), self.ring.signing_key("controller"))
        self.publish(topics.device(device_id, "desired"), envelope.to_bytes(), retain=True)
        return deployment_id

    def publish(self, topic: str, payload: bytes, retain: bool = False) -> None:
        assert self.transport.publish(topic, payload, qos=1, retain=retain, wait=10.0), f"broker did not ack {topic}"

    # -- events -----------------------------------------------------------------------------------

    def history(self, device_id: str, deployment_id: str) -> list[tuple[str, str]]:
        """(state, status) of every event the device reported for a deployment, in order."""
        return [(e.state, e.status) for e in list(self.events)
                if e.device_id == device_id and e.deployment_id == deployment_id]

    def final(self, device_id: str, deployment_id: str, timeout: float = 60) -> DeviceEvent:
        """Wait for the deployment's terminal event (state done) and return it."""
        def done() -> DeviceEvent | None:
            return next((e for e in list(self.events) if e.device_id == device_id
                         and e.deployment_id == deployment_id and e.state == "done"), None)
        event: DeviceEvent = wait_for(done, timeout, f"{device_id} to finish {deployment_id}")
        return event

    def rejection(self, device_id: str, since: int, timeout: float = 20) -> DeviceEvent:
        """Wait for a 'rejected' event reported after the first ``since`` events."""
        def found() -> DeviceEvent | None:
            return next((e for e in list(self.events)[since:] if e.device_id == device_id
                         and e.status in ("rejected", "failed")), None)
        event: DeviceEvent = wait_for(found, timeout, f"{device_id} to reject a message")
        return event


def replace(manifest: Manifest, **changes: Any) -> Manifest:
    """A copy of ``manifest`` with some fields changed (payload/target fields by nested replace)."""
    return dataclasses.replace(manifest, **changes)


@dataclasses.dataclass
class PausableAgent(AgentProcess):
    """An agent started with the hidden ``--pause-in-state`` hook when ``pause_in`` is set."""

    pause_in: str | None = None

    def extra_args(self) -> list[str]:
        return ["--pause-in-state", self.pause_in] if self.pause_in else []
