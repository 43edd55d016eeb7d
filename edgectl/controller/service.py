"""``edgectl controller run``: the long-running service that ingests device reports and drives rollouts.

One MQTT connection (:class:`~edgectl.controller.link.Link`: it publishes only while this
controller leads): paho's thread only enqueues; this loop drains the inbox in batches (one store
transaction per batch, so 1000 devices reporting every second stay cheap), serves artifact chunks
from a sender thread, applies operator requests queued in the store, and ticks the engine. Every
engine write carries the lease's fencing number (``Store.fenced``), and every timer runs on the
store's clock (:class:`~edgectl.controller.clock.StoreClock`).

The store may fail (down, restarting, read-only, disk full): the loop then keeps what devices send
in the inbox (bounded, the oldest telemetry dropped first), retries with backoff, says so in its
health (:class:`~edgectl.controller.health.ControllerHealth`) and resumes where the store says the
rollouts stand; the batch that failed goes back to the front of the inbox. What the broker holds
retained is compared with the store now and then (:mod:`~edgectl.controller.reconcile`).
"""

from __future__ import annotations

import logging
import os
import queue
import random
import tempfile
import threading
import time
from functools import lru_cache
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgecore.errors import EdgeError
from edgecore.protocol import topics
from edgecore.protocol.beacon import BEACON_EVERY_S, signed_beacon
from edgecore.protocol.envelope import TrustedKeys
from edgecore.protocol.reports import DeviceEvent
from edgecore.transport import TransportFactory
from edgectl.artifacts.chunk_server import ArtifactServer, ServedArtifact
from edgectl.controller.clock import StoreClock
from edgectl.controller.device_config import ConfigSender
from edgectl.controller.engine import Engine
from edgectl.controller.health import ControllerHealth, Probes
from edgectl.controller.inbox import Drops, Inbox, InboxLimits, Received
from edgectl.controller.ingest import EventReport, FollowUp, Ingest, LiveBirth
from edgectl.controller.leader import Leadership
from edgectl.controller.link import Link
from edgectl.controller.logs import send_pending
from edgectl.controller.reconcile import EVERY_S, Reconciler, reconcile
from edgectl.controller.records import (
    ACTIVE,
    IN_FLIGHT,
    DeviceEventRow,
    DeviceStatus,
    PackageRef,
    RolloutDevice,
    RolloutRow,
    RolloutStatus,
)
from edgectl.controller.sets import SetMessage, sign_message
from edgectl.controller.store import Store
from edgectl.controller.store.protocol import Fenced, StoreUnavailable
from edgectl.controller.subscriptions import PLAIN_LEAVES, TelemetrySubscription
from edgectl.controller.takeover import catch_up
from edgectl.controller.webhook_sender import WebhookSender
from edgectl.controller.webhooks import RetryPolicy
from edgectl.fleet.direct import signed_command, signed_desired
from edgectl.package import Package, read_package

__all__ = ["ACK", "Controller", "backend_fallback"]

log = logging.getLogger(__name__)

DROPS_AUDIT_S = 60.0
WATCH_EVERY_S = 10.0
STORE_RETRY_MAX_S = 5.0
AWAITED = (*IN_FLIGHT, DeviceStatus.ROLLBACK_SENT)
# The deployment id of the empty desired state that acknowledges a device the controller holds no
# desired state for: the agent takes it as "keep what you have", and as proof that this broker is the fleet's.
ACK = "ack"


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
    from edgecore.backends import default_registry

    provider = default_registry().provider_of(backend) or backend
    return provider != providers[0]


class Controller:
    """The service: call ``run()`` until ``stop()``; ``health``, ``drops`` and counters for the API and benchmarks.

    ``watch_s``: how long telemetry may stop while devices are online before the controller says so;
    ``reconcile_s``: the period of reconciliation while a rollout awaits devices."""

    def __init__(self, store: Store, transport_factory: TransportFactory, key: Ed25519PrivateKey, trusted: TrustedKeys,
                 tick_s: float = 0.5, limits: InboxLimits | None = None, share_group: str = "", watch_s: float = 60.0,
                 reconcile_s: float = EVERY_S, webhooks: RetryPolicy | None = None) -> None:
        self.store = store
        # One engine leader per store (leader.py); replicas share telemetry in this group where the broker can.
        self.leader = Leadership(store.lease(), self._gained, self._lost)
        self.clock = StoreClock(store.now)
        self.share_group = share_group
        self.key = key
        self.trusted = trusted
        self.tick_s = tick_s
        # Oversized payloads are dropped unparsed, a flood stays within a byte budget, and a body
        # naming another device than its topic is dropped: all counted here (logged, audited).
        self.drops = Drops()
        self.inbox = Inbox(limits, self.drops)
        self._drops_audited: dict[str, int] = {}
        self._drops_audited_at = -DROPS_AUDIT_S
        self._reconnected = threading.Event()
        # The seam: MqttTransport in service, edgecore.transport_memory in fast tests.
        self.transport = Link(transport_factory, self.inbox, self._reconnected.set, lambda: self.leader.leading)
        self.server = ArtifactServer(self.transport)
        self.ingest = Ingest(store, self.drops)
        self.fenced = store.fenced(self.leader.token)  # what the engine writes: refused once another controller leads
        self.engine = Engine(self.fenced, self, backend_fallback, self.clock)
        self.configs = ConfigSender()  # desired device configurations, published retained by the leader
        self.reconciler = Reconciler(transport_factory, reconcile_s)
        self.health = ControllerHealth(Probes(
            leading=lambda: self.leader.leading, epoch=self._epoch,
            broker=lambda: self.transport.connected, buffered=lambda: (self.inbox.qsize(), self.inbox.waiting_bytes),
            clock_off=lambda: len(self.ingest.clock_off)))
        self.telemetry = TelemetrySubscription(self.transport, share_group, watch_s, self.health)
        # Webhook deliveries, on every replica (each delivery is claimed in the store by one sender).
        self.webhooks = WebhookSender(store, webhooks or RetryPolicy())
        self.packages: dict[str, Package] = {}
        self._cache = Path(tempfile.mkdtemp(prefix="edgectl-controller-"))
        self.stopping = threading.Event()
        self.messages = 0
        self._started = False  # "controller started" is in the audit log
        self._caught_up = True  # False after taking the lease or the store's return, until rows caught up
        self._connect_due = False  # the connection must be made (again)
        self._overflow_seen = 0
        self._watched_at = 0.0
        self._beacon_at = 0.0  # when the fleet's beacon is due again (monotonic): at once after a connect or takeover

    def _epoch(self) -> int | None:
        token = self.leader.token()
        return None if token is None else token.epoch

    # -- Publisher for the engine -----------------------------------------------------------------

    def desired(self, device_id: str, message: SetMessage) -> bytes:
        payload = sign_message(self.key, message, self._package_of)
        self.send(device_id, "desired", payload)
        return payload

    def expect(self, rollout: RolloutRow, rows: list[RolloutDevice]) -> None:
        for row in rows:
            if row.variant:
                self.server.expect(self._package(rollout, row.variant).manifest.artifact_id, [row.device_id])

    def rollback(self, rollout: RolloutRow, device_id: str, message: SetMessage) -> tuple[bool, bytes]:
        acked = self.send(device_id, "commands", signed_command(self.key, device_id, "rollback", {"deployment_id": rollout.id}))
        return acked, self.desired(device_id, message)

    def send(self, device_id: str, leaf: str, payload: bytes) -> bool:
        if not self.leader.leading:  # a controller that lost the engine lease publishes nothing (the link refuses too)
            log.warning("not the engine leader: %s for %s not sent", leaf, device_id)
            return False
        ok = self.transport.publish(topics.device(device_id, leaf), payload, qos=1, retain=leaf == "desired", wait=5.0)
        if not ok:  # desired states are republished from the store, rollbacks resent, when the broker is back
            log.warning("broker did not take %s for %s", leaf, device_id)
        return ok

    def _package(self, rollout: RolloutRow, variant: str) -> Package:
        return self._package_of(rollout.spec.package(variant))

    def _package_of(self, info: PackageRef) -> Package:
        """A kept package, read (and its artifact served) once; a set may name packages of any rollout."""
        variant = info.variant
        if variant not in self.packages:
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
        self.transport.connect()
        for leaf in PLAIN_LEAVES:
            self.transport.subscribe(topics.device("+", leaf), 1)
        self.telemetry.subscribe(self.leader.replicated)
        self.server.start()
        self.webhooks.start()
        next_tick = 0.0
        while not self.stopping.is_set():
            try:
                next_tick = self._cycle(next_tick)
            except StoreUnavailable as exc:
                self._wait_for_store(exc)
            except Fenced as exc:  # the lease passed on while this tick ran: nothing was written
                log.warning("%s", exc)
                self.leader.check()
        self.webhooks.stop()
        self.server.stop()
        self.transport.close()
        self.leader.release()

    def _cycle(self, next_tick: float) -> float:
        """Drain the inbox for half a tick; tick when due; return when the next tick is due."""
        self._drain(time.monotonic() + self.tick_s / 2)
        if self._reconnected.is_set():
            self._reconnected.clear()
            self.reconciler.due("reconnect")
            self._beacon_at = 0.0
            self.configs.republish()
            # A replica that takes over later finds the retained desired states in place.
            count = self.engine.reports.republish() if self.leader.leading else 0
            if count:
                self.fenced.audit("desired states republished", f"{count} after (re)connect")
        if time.monotonic() < next_tick:
            return next_tick
        self.clock.sync()
        if not self._started:
            self.store.audit("controller started", f"store {self.store.location()}, pid {os.getpid()}")
            self._started = True
        if self._connect_due:
            self._reconnect()
        if self.leader.check():
            self._lead()
        self._watch()
        self._audit_drops()
        return time.monotonic() + self.tick_s

    def _lead(self) -> None:
        """One engine tick: catch up if due, operator requests, events no leader applied, chunks, the engine, reconciliation."""
        self._beacon()
        if not self._caught_up:
            catch_up(self.fenced, self.engine.reports, self.leader.replicated)
            self._caught_up = True
        for rollout_id, action in self.fenced.take_requests():
            self.engine.request(rollout_id, action)
        self._apply_unclaimed()
        send_pending(self.store, self.key, self.send, time.time())  # operators' log requests, from any replica
        self.configs.send(self.store, self.key, self._publish_config, self.engine.gone, time.time())
        self._serve_active()
        self.engine.tick()
        self._withdraw()
        for why, found in self.reconciler.results():
            self._apply_reconciled(why, found)
        if self.drops["overflow"] > self._overflow_seen:
            self._overflow_seen = self.drops["overflow"]
            self.reconciler.due("overflow")
        self.reconciler.start_if_due(self._awaiting)

    def _withdraw(self) -> None:
        """A decommissioned device gets no more updates: its retained desired state (and any retained command) is
        cleared on the broker, once (an empty retained message removes it; agents refuse the empty one they may get)."""
        for device_id in self.fenced.unwithdrawn():
            cleared = [self.transport.publish(topics.device(device_id, leaf), b"", qos=1, retain=True, wait=5.0)
                       for leaf in ("desired", "commands", "config")]
            if all(cleared):
                self.fenced.mark_withdrawn(device_id, self.clock())
                self.fenced.audit("device withdrawn", "its retained desired state cleared on the broker", device_id=device_id)

    def _publish_config(self, device_id: str, payload: bytes) -> bool:
        """A signed device configuration, retained (edgectl/controller/device_config.py)."""
        return self.transport.publish(topics.device(device_id, "config"), payload, qos=1, retain=True, wait=5.0)

    def _beacon(self) -> None:
        """Keep the fleet's signed beacon retained (edgecore/protocol/beacon.py): agents leave brokers without it."""
        if time.monotonic() >= self._beacon_at and self.transport.publish(topics.FLEET_BEACON, signed_beacon(self.key),
                                                                          qos=1, retain=True):
            self._beacon_at = time.monotonic() + BEACON_EVERY_S

    def _wait_for_store(self, exc: StoreUnavailable) -> None:
        """Back off until the store answers; devices' reports wait in the inbox meanwhile."""
        if self.health.store_lost(str(exc)):
            log.error("%s: device reports wait in memory (at most %d MiB, the oldest telemetry dropped first) "
                      "until it answers; retrying with backoff", exc, self.inbox.limits.budget_bytes >> 20)
        delay = 0.5
        while not self.stopping.wait(delay * random.uniform(0.8, 1.2)):
            try:
                self.store.ping()
                self.clock.sync()
            except StoreUnavailable as again:
                self.health.store_lost(str(again))
                delay = min(delay * 2, STORE_RETRY_MAX_S)
                continue
            down = self.health.store_back()
            log.warning("the store answers again after %.1fs; resuming", down or 0.0)
            self._caught_up = False
            self.reconciler.due("store back")
            return

    def _watch(self) -> None:
        if time.monotonic() - self._watched_at >= WATCH_EVERY_S:
            self._watched_at = time.monotonic()
            self.telemetry.check(self.store.telemetry_summary, self.clock())

    def _gained(self) -> None:
        """Leading from now on: catch up (at the next tick) on what devices reported while no one led."""
        self._caught_up = False
        self._beacon_at = 0.0
        if self.leader.replicated:
            self.fenced.audit("controller leading", f"pid {os.getpid()}")

    def _lost(self) -> None:
        """Not leading any more: a new connection, so nothing the old one still holds is ever sent."""
        self._connect_due = True
        self._reconnect()

    def _reconnect(self) -> None:
        try:
            self.transport.renew()
            self._connect_due = False
        except EdgeError as exc:
            log.warning("%s; trying again at the next tick", exc)

    def _apply_unclaimed(self) -> None:
        """Events a standby replica kept, or that came while no controller led: the leader applies each once."""
        for e in self.fenced.unclaimed_events():
            self._on_event(e.device_id, DeviceEvent(e.device_id, e.deployment_id, e.state, e.status, e.detail, e.ts, e.data))

    def _on_event(self, device_id: str, event: DeviceEvent) -> None:
        kept = DeviceEventRow(device_id, event.ts, event.deployment_id, event.state, event.status, event.detail, event.data)
        if self.fenced.claim_event(kept):  # once, whichever replica kept it and however often it came
            self._release(device_id, event)
            self.engine.reports.on_event(device_id, event)

    def _acknowledge(self, device_id: str) -> None:
        """A device (re)connected that the store keeps no desired state for: a signed, empty one tells it this
        broker is the fleet's (agents leave a broker that delivers nothing from the controller)."""
        if not any(row.desired for row in self.store.device_rollouts(device_id)):
            self.send(device_id, "desired", signed_desired(self.key, device_id, ACK, None))

    def _awaiting(self) -> bool:
        """Whether a rollout waits for devices to report (then a lost report stalls it: reconcile)."""
        return any(row.status in AWAITED for rollout in self.store.rollouts(ACTIVE)
                   for row in self.store.rollout_devices(rollout.id))

    def _apply_reconciled(self, why: str, found: list[Received]) -> None:
        """Store and apply the retained reports that differ from the store; count them."""
        counts, states = reconcile(found, self.store, self.ingest, self.clock)
        for state in states:
            self.engine.reports.on_state(state.device_id, state.state)
        self.health.reconciliation(dict(counts))
        if counts:
            detail = ", ".join(f"{leaf} {n}" for leaf, n in sorted(counts.items()))
            log.warning("reconciliation (%s): the store lacked retained reports the broker holds: %s", why, detail)
            self.store.audit("reports reconciled", f"{why}: {detail}")

    def stop(self) -> None:
        self.stopping.set()

    def _chunk_request(self, received: Received) -> None:
        try:
            request = self.ingest.chunk_request(received.message)
        except EdgeError as exc:
            log.warning("ignored %s: %s", received.message.topic, exc)
            return
        if request is not None:
            self.server.handle_request(request)

    def _audit_drops(self) -> None:
        """Put the drop counters in the audit log when they changed: at once the first time, then once a minute."""
        counts = self.drops.counts()
        if counts == self._drops_audited or time.monotonic() - self._drops_audited_at < DROPS_AUDIT_S:
            return
        self._drops_audited, self._drops_audited_at = counts, time.monotonic()
        self.store.audit("messages dropped", ", ".join(f"{reason} {n}" for reason, n in sorted(counts.items())))

    def _drain(self, until: float) -> None:
        batch: list[Received] = []
        while time.monotonic() < until and len(batch) < 2000:
            try:
                batch.append(self.inbox.get_received(max(0.0, min(0.05, until - time.monotonic()))))
            except queue.Empty:
                if batch:
                    break
        if not batch:
            return
        try:
            with self.ingest.batch():  # a batch that fails leaves no trace in ingest's state either: it is retried whole
                followups = [f for received in batch for f in self._ingest(received)]
        except StoreUnavailable:
            self.inbox.putback(batch)  # kept, in order, for when the store answers again
            raise
        self.messages += len(batch)
        if self.leader.leading:  # else stored: the leader applies events (kept unclaimed) and reads the state
            for followup in followups:
                self._follow(followup)

    def _ingest(self, received: Received) -> list[FollowUp]:
        """Store one message; what the rollouts must see of it (nothing, for what a standby received)."""
        message = received.message
        if message.topic.endswith("/chunk-requests"):
            if self.leader.leading:
                self._chunk_request(received)
            return []
        if message.topic.endswith("/telemetry"):
            self.telemetry.watch.seen()
        try:
            report = self.ingest.apply(message, self.clock.at(received.at))
        except StoreUnavailable:
            raise
        except EdgeError as exc:
            log.warning("ignored %s: %s", message.topic, exc)
            return []
        found: list[FollowUp] = [] if report is None else [report]
        device_id = topics.parse_device_topic(message.topic).device_id
        if message.topic.endswith("/birth") and not message.retain and not self.ingest.decommissioned(device_id):
            found.append(LiveBirth(device_id))  # a live birth: it just connected (a decommissioned one is not acknowledged)
        return found

    def _follow(self, followup: FollowUp) -> None:
        if isinstance(followup, EventReport):
            self._on_event(followup.device_id, followup.event)
        elif isinstance(followup, LiveBirth):
            self.engine.reports.on_birth(followup.device_id)
            self._acknowledge(followup.device_id)
        else:
            self.engine.reports.on_state(followup.device_id, followup.state)

    def _release(self, device_id: str, event: DeviceEvent) -> None:
        """A device that finished (or refused) before asking for chunks will not ask: the server stops waiting for it."""
        if event.status != "running":
            for artifact_id in self.packages:
                self.server.release(artifact_id, device_id)

    def _serve_active(self) -> None:
        for rollout in self.store.rollouts((*ACTIVE, RolloutStatus.DONE)):
            for info in rollout.spec.packages:
                self._package(rollout, info.variant)

