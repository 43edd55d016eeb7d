"""Deploy one signed package to named devices and follow them until each commits or fails.

This is the foreground path of ``edgectl deploy --device``: it publishes each device's signed
desired state, serves the artifact's chunks to whoever asks, and reports every device's
transitions until all are done or the timeout passes.
"""

from __future__ import annotations

import queue
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agent.errors import EdgeError
from agent.protocol import topics
from agent.protocol.envelope import COMMAND_TYPE, DESIRED_TYPE, sign
from agent.protocol.messages import Command, DesiredModel, DesiredState, DeviceEvent
from agent.transport import Message, MqttTransport
from edgectl.artifact_server import ArtifactServer, ServedArtifact
from edgectl.artifacts.urls import urls_for
from edgectl.package import Package
from edgectl.sequence import next_sequence

__all__ = ["DeviceProgress", "deploy_to_devices", "new_deployment_id", "publish_desired", "publish_desired_all", "signed_command",
           "signed_desired"]

TERMINAL = ("ok", "failed", "rolled-back", "rejected")
DESIRED_VALIDITY_S = 7 * 86400


def new_deployment_id() -> str:
    return f"d-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


@dataclass
class DeviceProgress:
    device_id: str
    state: str = "pending"
    status: str = "pending"
    detail: str = ""
    data: dict[str, object] = field(default_factory=dict)
    history: list[str] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return self.status in TERMINAL


def signed_desired(key: Ed25519PrivateKey, device_id: str, deployment_id: str, package: Package | None,
                   allow_downgrade: bool = False, shadow_min: float | None = None, urls: Sequence[str] = ()) -> bytes:
    """A signed desired state for one device; ``package`` None means: keep what you have.

    ``shadow_min``: run the new model beside the serving one first and cut over only at this agreement.
    ``urls``: where the device may fetch the payload by HTTP(S) Range before asking for MQTT chunks."""
    now = time.time()
    model = None if package is None else DesiredModel(package.manifest.name, package.manifest.version, package.envelope,
                                                      tuple(urls))
    options: dict[str, Any] = {"allow_downgrade": allow_downgrade}
    if shadow_min is not None:
        options["shadow"] = {"min_agreement": shadow_min}
    desired = DesiredState(
        device_id=device_id, seq=next_sequence(), issued_at=now, expires_at=now + DESIRED_VALIDITY_S,
        deployment_id=deployment_id, model=model, options=options,
    )
    return sign(DESIRED_TYPE, desired.to_payload(), key).to_bytes()


def signed_command(key: Ed25519PrivateKey, device_id: str, command: str, args: dict[str, Any]) -> bytes:
    """A signed one-off command (rollback, remeasure, report) for one device."""
    now = time.time()
    message = Command(device_id, next_sequence(), now, now + DESIRED_VALIDITY_S, command, args)
    return sign(COMMAND_TYPE, message.to_payload(), key).to_bytes()


def publish_desired(transport: MqttTransport, key: Ed25519PrivateKey, device_id: str, deployment_id: str,
                    package: Package, allow_downgrade: bool = False) -> None:
    publish_desired_all(transport, key, [device_id], deployment_id, package, allow_downgrade)


def publish_desired_all(transport: MqttTransport, key: Ed25519PrivateKey, device_ids: list[str], deployment_id: str,
                        package: Package, allow_downgrade: bool = False, urls: Sequence[str] = ()) -> None:
    """Publish every device's signed desired state, then wait once for the broker's acks.

    A broker acknowledges the QoS 1 publishes of one connection in the order it received them, so
    the ack of the last one stands for all: no round trip per device."""
    for n, device_id in enumerate(device_ids):
        envelope = signed_desired(key, device_id, deployment_id, package, allow_downgrade, urls=urls)
        wait = 10.0 if n == len(device_ids) - 1 else None
        if not transport.publish(topics.device(device_id, "desired"), envelope, qos=1, retain=True, wait=wait):
            what = f"the desired state for {device_id}" if wait is None else f"the desired states of {len(device_ids)} device(s)"
            raise EdgeError(f"the broker did not acknowledge {what}")


def deploy_to_devices(
    transport: MqttTransport,
    inbox: queue.Queue[Message],
    package: Package,
    device_ids: list[str],
    key: Ed25519PrivateKey,
    timeout_s: float,
    on_progress: Callable[[DeviceProgress], None] = lambda _p: None,
    allow_downgrade: bool = False,
    server: ArtifactServer | None = None,
    artifact_urls: Sequence[str] = (),
) -> tuple[str, dict[str, DeviceProgress]]:
    """Returns the deployment id and each device's final progress.

    ``server``: a started ArtifactServer on ``transport`` to answer chunk requests with (its owner
    reads its counters and stops it); by default one is started and stopped for this deployment.
    ``artifact_urls``: HTTP(S) URLs of the payload (``{artifact_id}`` filled in) named in each desired state."""
    deployment_id = new_deployment_id()
    progress = {d: DeviceProgress(d) for d in device_ids}
    own = server is None
    server = server or ArtifactServer(transport)
    m = package.manifest
    # Told which devices will ask, the server starts sending as soon as the last of them has asked.
    server.serve(ServedArtifact(m.artifact_id, package.payload, m.payload.chunk_size, len(m.payload.chunks)), expect=device_ids)
    if own:
        server.start()
    transport.subscribe(topics.device("+", "events"), 1)
    try:
        publish_desired_all(transport, key, device_ids, deployment_id, package, allow_downgrade,
                            urls_for(artifact_urls, m.artifact_id))
        _follow(inbox, server, m.artifact_id, deployment_id, progress, timeout_s, on_progress)
    finally:
        if own:
            server.stop()
    return deployment_id, progress


def _follow(inbox: queue.Queue[Message], server: ArtifactServer, artifact_id: str, deployment_id: str,
            progress: dict[str, DeviceProgress], timeout_s: float, on_progress: Callable[[DeviceProgress], None]) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(p.done for p in progress.values()) and time.monotonic() < deadline:
        try:
            message = inbox.get(timeout=0.2)
        except queue.Empty:
            continue
        if message.topic.endswith("/chunk-requests"):
            server.handle_request(message.payload)
        elif message.topic.endswith("/events"):
            event = _apply_event(message.payload, deployment_id, progress, on_progress)
            if event is not None and progress[event.device_id].done:
                server.release(artifact_id, event.device_id)  # finished or refused without asking: do not wait for it
    for p in progress.values():
        if not p.done:
            p.status, p.detail = "timeout", f"no final report within {timeout_s:.0f}s (last state: {p.state})"
            on_progress(p)


def _apply_event(raw: bytes, deployment_id: str, progress: dict[str, DeviceProgress],
                 on_progress: Callable[[DeviceProgress], None]) -> DeviceEvent | None:
    try:
        event = DeviceEvent.from_payload(raw)
    except EdgeError:
        return None
    p = progress.get(event.device_id)
    # A desired state the device refused before reading it carries no deployment id.
    if p is None or (event.deployment_id != deployment_id and event.status != "rejected"):
        return None
    p.state, p.status, p.detail = event.state, event.status, event.detail
    p.data.update(event.data)
    p.history.append(event.state)
    on_progress(p)
    return event
