"""Deploy signed packages to named devices and follow them until each commits or fails.

This is the foreground path of ``edgectl deploy --device``: it publishes each device's signed
desired state, serves the artifacts' chunks to whoever asks, and reports every device's
transitions until all are done or the timeout passes. One model package goes as a schema 1
desired state (agents from before sets take it); several packages, or a pipeline, go as a schema 2
set of exactly those (docs/protocol.md): the device then runs these and nothing else.
"""

from __future__ import annotations

import logging
import queue
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgecore.errors import EdgeError
from edgecore.protocol import topics
from edgecore.protocol.envelope import COMMAND_TYPE, DESIRED_TYPE, sign
from edgecore.protocol.messages import Command, DeployOptions, DesiredModel, DesiredSet, DesiredState
from edgecore.protocol.reports import ChunkRequest, DeviceEvent, read_report
from edgecore.transport import Message, Transport
from edgectl.artifacts.chunk_server import ArtifactServer, ServedArtifact
from edgectl.artifacts.urls import urls_for
from edgectl.package import Package
from edgectl.sequence import next_sequence

__all__ = ["DeviceProgress", "deploy_to_devices", "new_deployment_id", "publish_desired", "publish_desired_all", "signed_command",
           "signed_desired", "signed_set"]

log = logging.getLogger(__name__)

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
    models: dict[str, str] = field(default_factory=dict)  # a set's: each model's final status once it has one

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


def signed_set(key: Ed25519PrivateKey, device_id: str, deployment_id: str, packages: Sequence[Package],
               allow_downgrade: bool = False, urls: Sequence[str] = ()) -> bytes:
    """A signed schema 2 desired set of exactly ``packages`` (models and pipelines), each under ``deployment_id``.

    ``urls``: HTTP(S) URLs with ``{artifact_id}``, filled in per package."""
    now = time.time()

    def entry(package: Package) -> DesiredModel:
        m = package.manifest
        return DesiredModel(m.name, m.version, package.envelope, urls_for(urls, m.artifact_id), deployment_id,
                            DeployOptions(allow_downgrade))

    desired = DesiredSet(device_id, next_sequence(), now, now + DESIRED_VALIDITY_S, deployment_id,
                         tuple(entry(p) for p in packages if not p.manifest.is_pipeline),
                         tuple(entry(p) for p in packages if p.manifest.is_pipeline))
    return sign(DESIRED_TYPE, desired.to_payload(), key).to_bytes()


def signed_command(key: Ed25519PrivateKey, device_id: str, command: str, args: dict[str, Any]) -> bytes:
    """A signed one-off command (rollback, remeasure, report) for one device."""
    now = time.time()
    message = Command(device_id, next_sequence(), now, now + DESIRED_VALIDITY_S, command, args)
    return sign(COMMAND_TYPE, message.to_payload(), key).to_bytes()


def publish_desired(transport: Transport, key: Ed25519PrivateKey, device_id: str, deployment_id: str,
                    package: Package, allow_downgrade: bool = False) -> None:
    publish_desired_all(transport, key, [device_id], deployment_id, package, allow_downgrade)


def publish_desired_all(transport: Transport, key: Ed25519PrivateKey, device_ids: list[str], deployment_id: str,
                        package: Package, allow_downgrade: bool = False, urls: Sequence[str] = ()) -> None:
    """Publish every device's signed desired state, then wait once for the broker's acks.

    A broker acknowledges the QoS 1 publishes of one connection in the order it received them, so
    the ack of the last one stands for all: no round trip per device."""
    _publish_all(transport, device_ids, lambda device_id: signed_desired(key, device_id, deployment_id, package,
                                                                          allow_downgrade, urls=urls))


def _publish_all(transport: Transport, device_ids: list[str], signed: Callable[[str], bytes]) -> None:
    for n, device_id in enumerate(device_ids):
        envelope = signed(device_id)
        wait = 10.0 if n == len(device_ids) - 1 else None
        if not transport.publish(topics.device(device_id, "desired"), envelope, qos=1, retain=True, wait=wait):
            what = f"the desired state for {device_id}" if wait is None else f"the desired states of {len(device_ids)} device(s)"
            raise EdgeError(f"the broker did not acknowledge {what}")


def deploy_to_devices(
    transport: Transport,
    inbox: queue.Queue[Message],
    package: Package | Sequence[Package],
    device_ids: list[str],
    key: Ed25519PrivateKey,
    timeout_s: float,
    on_progress: Callable[[DeviceProgress], None] = lambda _p: None,
    allow_downgrade: bool = False,
    server: ArtifactServer | None = None,
    artifact_urls: Sequence[str] = (),
) -> tuple[str, dict[str, DeviceProgress]]:
    """Returns the deployment id and each device's final progress.

    ``package``: one package (sent as schema 1), or several, pipelines among them (sent as one schema 2
    set; a device is done once every one has its final event). ``server``: a started ArtifactServer
    on ``transport`` to answer chunk requests with (its owner reads its counters and stops it); by
    default one is started and stopped for this deployment. ``artifact_urls``: HTTP(S) URLs of the
    payloads (``{artifact_id}`` filled in) named in each desired state."""
    packages = [package] if isinstance(package, Package) else list(package)
    deployment_id = new_deployment_id()
    names = [p.manifest.name for p in packages]
    progress = {d: DeviceProgress(d, models={} if len(packages) == 1 else dict.fromkeys(names, "")) for d in device_ids}
    own = server is None
    server = server or ArtifactServer(transport)
    for p in packages:  # told which devices will ask, the server sends as soon as the last of them has asked
        m = p.manifest
        server.serve(ServedArtifact(m.artifact_id, p.payload, m.payload.chunk_size, len(m.payload.chunks)), expect=device_ids)
    if own:
        server.start()
    transport.subscribe(topics.device("+", "events"), 1)
    try:
        if len(packages) == 1 and not packages[0].manifest.is_pipeline:
            m = packages[0].manifest
            publish_desired_all(transport, key, device_ids, deployment_id, packages[0], allow_downgrade,
                                urls_for(artifact_urls, m.artifact_id))
        else:
            _publish_all(transport, device_ids, lambda device_id: signed_set(key, device_id, deployment_id, packages,
                                                                              allow_downgrade, artifact_urls))
        _follow(inbox, server, [p.manifest.artifact_id for p in packages], deployment_id, progress, timeout_s, on_progress)
    finally:
        if own:
            server.stop()
    return deployment_id, progress


def _follow(inbox: queue.Queue[Message], server: ArtifactServer, artifact_ids: list[str], deployment_id: str,
            progress: dict[str, DeviceProgress], timeout_s: float, on_progress: Callable[[DeviceProgress], None]) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(p.done for p in progress.values()) and time.monotonic() < deadline:
        try:
            message = inbox.get(timeout=0.2)
        except queue.Empty:
            continue
        try:  # the one reader of device reports: a body naming another device than its topic is refused here
            report = read_report(message.topic, message.payload)
        except EdgeError as exc:
            log.warning("ignored %s: %s", message.topic, exc)
            continue
        if isinstance(report, ChunkRequest):
            server.handle_request(report)
        elif isinstance(report, DeviceEvent) and _apply_event(report, deployment_id, progress, on_progress) \
                and progress[report.device_id].done:
            for artifact_id in artifact_ids:  # finished or refused without asking: do not wait for it
                server.release(artifact_id, report.device_id)
    for p in progress.values():
        if not p.done:
            p.status, p.detail = "timeout", f"no final report within {timeout_s:.0f}s (last state: {p.state})"
            on_progress(p)


def _apply_event(event: DeviceEvent, deployment_id: str, progress: dict[str, DeviceProgress],
                 on_progress: Callable[[DeviceProgress], None]) -> bool:
    """Record an event of a device this deployment follows; False for anyone else's."""
    p = progress.get(event.device_id)
    # A desired state the device refused before reading it carries no deployment id.
    if p is None or (event.deployment_id != deployment_id and event.status != "rejected"):
        return False
    p.data.update(event.data)
    p.history.append(event.state)
    if not p.models:  # one model: its events are the device's
        p.state, p.status, p.detail = event.state, event.status, event.detail
    elif _final_for_models(event, p):
        finals = [status for status in p.models.values() if status]
        if len(finals) == len(p.models):
            failed = next((s for s in finals if s != "ok"), None)
            p.state, p.status = "done", failed or "ok"
            p.detail = "; ".join(f"{name}: {status}" for name, status in p.models.items()) if failed else event.detail
        else:
            p.state, p.status, p.detail = event.state, "running", f"{event.model}: {event.detail}"
    else:
        p.state, p.detail = event.state, f"{event.model or 'set'}: {event.detail}"
    on_progress(p)
    return True


def _final_for_models(event: DeviceEvent, p: DeviceProgress) -> bool:
    """Record a set's event that ends a model's part (all of them, when it names none: a refusal of the whole set)."""
    if event.status not in TERMINAL or event.state == "remove":
        return False
    names = [event.model] if event.model in p.models else list(p.models) if event.model is None else []
    for name in names:
        p.models[name] = event.status
    return bool(names)
