"""``edgectl controller run``: the long-running service that ingests device reports and drives rollouts.

One MQTT connection: paho's thread only enqueues; this loop drains the inbox in batches (one
store transaction per batch, so 1000 devices reporting every second stay cheap), serves artifact
chunks from a sender thread, applies operator requests queued in the store, and ticks the engine.
"""

from __future__ import annotations

import logging
import os
import queue
import tempfile
import threading
import time
from functools import lru_cache
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agent.errors import EdgeError
from agent.protocol import topics
from agent.protocol.envelope import TrustedKeys
from agent.protocol.messages import DeviceEvent
from agent.transport import Message, Transport, TransportFactory
from edgectl.artifact_server import ArtifactServer, ServedArtifact
from edgectl.artifacts.urls import urls_for
from edgectl.controller.engine import Engine
from edgectl.controller.inbox import Drops, Inbox, InboxLimits
from edgectl.controller.leader import Leadership
from edgectl.controller.records import ACTIVE, IN_FLIGHT, DeviceEventRow, DeviceStatus, RolloutDevice, RolloutRow, RolloutStatus
from edgectl.controller.reports import desired_seq, shadow_threshold
from edgectl.controller.store import Store
from edgectl.direct_deploy import signed_command, signed_desired
from edgectl.package import Package, read_package
from edgectl.registry import EventReport, Ingest, LiveBirth, Report
from edgectl.sequence import raise_sequence_floor

__all__ = ["Controller", "backend_fallback"]

log = logging.getLogger(__name__)

DROPS_AUDIT_S = 60.0
LEAVES = ("birth", "presence", "state", "events", "telemetry")
CATCH_UP = (*IN_FLIGHT, DeviceStatus.DEFERRED, DeviceStatus.ROLLBACK_SENT)


@lru_cache(maxsize=64)
def _profile_providers(target: str) -> tuple[str, ...]:
    from targets import load_profile  # host-only

    try:
        return tuple(ep.name for ep in load_profile(target).execution_providers)
    except EdgeError:
        return ()


def backend_fallback(target: str | None, backend: str) -> bool | None:
    """Whether ``backend`` (``onnxruntime/CPUExecutionProvider``) ranks below the profile's first EP."""
    providers = _profile_providers(target) if target else ()
    if not providers or not backend:
        return None
    from agent.backends import default_registry

    provider = default_registry().provider_of(backend) or backend
    return provider != providers[0]


class Controller:
    """The service: call ``run()`` until ``stop()``; ``ingest_lag_s`` and counters for benchmarks."""

    def __init__(self, store: Store, transport_factory: TransportFactory, key: Ed25519PrivateKey, trusted: TrustedKeys,
                 tick_s: float = 0.5, limits: InboxLimits | None = None, share_group: str = "") -> None:
        self.store = store
        # One engine leader per store (leader.py); replicas on PostgreSQL share telemetry in this group.
        self.leader = Leadership(store.lease(), self._take_over)
        self.share_group = share_group
        self.key = key
        self.trusted = trusted
        self.tick_s = tick_s
        # Oversized payloads are dropped unparsed, a flood stays within a byte budget, and a body
        # naming another device than its topic is dropped: all counted here (logged, audited).
        self.drops = Drops()
        self.inbox: queue.Queue[Message] = Inbox(limits, self.drops)
        self._drops_audited: dict[str, int] = {}
        self._drops_audited_at = -DROPS_AUDIT_S
        self._reconnected = threading.Event()
        # The seam: MqttTransport in service, agent.transport_memory in fast tests.
        self.transport: Transport = transport_factory(self.inbox, self._reconnected.set)
        self.server = ArtifactServer(self.transport)
        self.ingest = Ingest(store, self.drops)
        self.engine = Engine(store, self, backend_fallback)
        self.packages: dict[str, Package] = {}
        self._cache = Path(tempfile.mkdtemp(prefix="edgectl-controller-"))
        self.stopping = threading.Event()
        self.messages = 0

    # -- Publisher for the engine -----------------------------------------------------------------

    def desired(self, rollout: RolloutRow, row: RolloutDevice, cancel: bool = False) -> bytes:
        package = None if cancel else self._package(rollout, row.variant)
        urls = () if package is None else urls_for(rollout.spec.artifact_urls, package.manifest.artifact_id)
        payload = signed_desired(self.key, row.device_id, rollout.id, package, rollout.spec.allow_downgrade,
                                 None if cancel else shadow_threshold(rollout, row), urls)
        self.send(row.device_id, "desired", payload)
        return payload

    def expect(self, rollout: RolloutRow, rows: list[RolloutDevice]) -> None:
        for row in rows:
            if row.variant:
                self.server.expect(self._package(rollout, row.variant).manifest.artifact_id, [row.device_id])

    def rollback(self, rollout: RolloutRow, device_id: str) -> tuple[bool, bytes]:
        acked = self.send(device_id, "commands", signed_command(self.key, device_id, "rollback", {"deployment_id": rollout.id}))
        desired = signed_desired(self.key, device_id, rollout.id, None)
        self.send(device_id, "desired", desired)
        return acked, desired

    def send(self, device_id: str, leaf: str, payload: bytes) -> bool:
        if not self.leader.leading:  # a controller that lost the engine lease publishes nothing
            log.warning("not the engine leader: %s for %s not sent", leaf, device_id)
            return False
        ok = self.transport.publish(topics.device(device_id, leaf), payload, qos=1, retain=leaf == "desired", wait=5.0)
        if not ok:  # desired states are republished from the store, rollbacks resent, when the broker is back
            log.warning("broker did not take %s for %s", leaf, device_id)
        return ok

    def _package(self, rollout: RolloutRow, variant: str) -> Package:
        if variant not in self.packages:
            info = rollout.spec.package(variant)
            (self._cache / variant).mkdir(parents=True, exist_ok=True)
            package = read_package(self.store.package_file(variant, Path(info.path)), self.trusted, self._cache / variant)
            self.packages[variant] = package
            m = package.manifest
            # Variants with equal payloads share one artifact: serving it again changes nothing.
            self.server.serve(ServedArtifact(m.artifact_id, package.payload, m.payload.chunk_size, len(m.payload.chunks)))
        return self.packages[variant]

    # -- the loop ---------------------------------------------------------------------------------

    def run(self) -> None:
        self.leader.check()  # SQLite: refuses a second controller on the same file
        for leaf in LEAVES:
            self.transport.subscribe(self._filter(leaf), 1)
        self.transport.connect()
        self.server.start()
        self.store.audit("controller started", f"store {self.store.location()}")
        next_tick = 0.0
        while not self.stopping.is_set():
            self._drain(time.monotonic() + self.tick_s / 2)
            if self._reconnected.is_set():
                self._reconnected.clear()
                # A replica that takes over later finds the retained desired states in place.
                count = self.engine.republish() if self.leader.leading else 0
                if count:
                    self.store.audit("desired states republished", f"{count} after (re)connect")
            if time.monotonic() >= next_tick:
                if self.leader.check():
                    for rollout_id, action in self.store.take_requests():
                        self.engine.request(rollout_id, action)
                    self._apply_unclaimed()
                    self._serve_active()
                    self.engine.tick()
                self._audit_drops()
                next_tick = time.monotonic() + self.tick_s
        self.server.stop()
        self.transport.close()
        self.leader.release()

    def _filter(self, leaf: str) -> str:
        """Replicas share telemetry (the volume) on an MQTT 5 shared subscription; every replica gets
        the rest: retained messages never reach a shared subscription, and events are kept once."""
        topic = topics.device("+", leaf)
        return f"$share/{self.share_group}/{topic}" if leaf == "telemetry" and self.share_group and self.leader.replicated \
            else topic

    def _take_over(self) -> None:
        """Leading from now on: catch up on what devices reported while the previous leader was gone."""
        if not self.leader.replicated:
            return
        self.store.audit("controller leading", f"pid {os.getpid()}")
        raise_sequence_floor(self._highest_sequence_sent())
        for rollout in self.store.rollouts(ACTIVE):
            for row in self.store.rollout_devices(rollout.id):
                device = self.store.device(row.device_id) if row.status in CATCH_UP else None
                if device is not None and device.state:
                    self.engine.on_state(row.device_id, device.state)

    def _highest_sequence_sent(self) -> int:
        """The highest number any leader signed that the store knows of: stored desired states, and
        what each device reports it accepted last (which covers commands)."""
        highest = max((int((d.state or {}).get("last_seq") or 0) for d in self.store.devices()), default=0)
        for rollout in self.store.rollouts(ACTIVE):
            for row in self.store.rollout_devices(rollout.id):
                if row.desired:
                    highest = max(highest, desired_seq(row.desired))
        return highest

    def _apply_unclaimed(self) -> None:
        """Events a standby replica kept, or that came while no controller led: the leader applies each once."""
        with self.store.batch():
            for e in self.store.unclaimed_events():
                self._on_event(e.device_id, DeviceEvent(e.device_id, e.deployment_id, e.state, e.status, e.detail, e.ts, e.data))

    def _on_event(self, device_id: str, event: DeviceEvent) -> None:
        kept = DeviceEventRow(device_id, event.ts, event.deployment_id, event.state, event.status, event.detail, event.data)
        if self.store.claim_event(kept):  # once, whichever replica kept it and however often it came
            self._release(device_id, event)
            self.engine.on_event(device_id, event)

    def stop(self) -> None:
        self.stopping.set()

    def _chunk_request(self, message: Message) -> None:
        try:
            if not self.ingest.chunk_request_from_its_device(message):
                return
        except EdgeError as exc:
            log.warning("ignored %s: %s", message.topic, exc)
            return
        self.server.handle_request(message.payload)

    def _audit_drops(self) -> None:
        """Put the drop counters in the audit log when they changed: at once the first time, then once a minute."""
        counts = self.drops.counts()
        if counts == self._drops_audited or time.monotonic() - self._drops_audited_at < DROPS_AUDIT_S:
            return
        self._drops_audited, self._drops_audited_at = counts, time.monotonic()
        self.store.audit("messages dropped", ", ".join(f"{reason} {n}" for reason, n in sorted(counts.items())))

    def _drain(self, until: float) -> None:
        batch: list[Message] = []
        while time.monotonic() < until and len(batch) < 2000:
            try:
                batch.append(self.inbox.get(timeout=max(0.0, min(0.05, until - time.monotonic()))))
            except queue.Empty:
                if batch:
                    break
        if not batch:
            return
        followups: list[Report] = []
        with self.store.batch():
            for message in batch:
                self.messages += 1
                if message.topic.endswith("/chunk-requests"):
                    if self.leader.leading:
                        self._chunk_request(message)
                    continue
                try:
                    report = self.ingest.apply(message)
                except EdgeError as exc:
                    log.warning("ignored %s: %s", message.topic, exc)
                    continue
                if message.topic.endswith("/birth") and not message.retain:  # a live birth: it just connected
                    followups.append(LiveBirth(topics.parse_device_topic(message.topic).device_id))
                if report is not None:
                    followups.append(report)
            for followup in followups:
                if not self.leader.leading:
                    break  # stored; the leader applies events (kept unclaimed) and reads the state
                if isinstance(followup, EventReport):
                    self._on_event(followup.device_id, followup.event)
                elif isinstance(followup, LiveBirth):
                    self.engine.on_birth(followup.device_id)
                else:
                    self.engine.on_state(followup.device_id, followup.state)

    def _release(self, device_id: str, event: DeviceEvent) -> None:
        """A device that finished (or refused) before asking for chunks will not ask: the server stops waiting for it."""
        if event.status != "running":
            for artifact_id in self.packages:
                self.server.release(artifact_id, device_id)

    def _serve_active(self) -> None:
        for rollout in self.store.rollouts((*ACTIVE, RolloutStatus.DONE)):
            for info in rollout.spec.packages:
                self._package(rollout, info.variant)
