"""The edge-agent daemon: follows its desired state over MQTT, serves the active model, reports.

Threads: paho's network thread only enqueues; the main thread validates and dispatches messages
and publishes telemetry; one worker thread (agent.deploy.worker) makes every change to the served
model, deployments, rollbacks and remeasurements, in the order they were accepted; a job is saved
before its message is acknowledged. A bad message is logged once with its reason, counted, and
ignored: it never stops the agent or touches the active model.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from agent import __version__
from agent.backends import runtime_versions
from agent.config import AgentConfig
from agent.deploy.fetch import ChunkFetcher
from agent.deploy.http_fetch import HttpSettings
from agent.deploy.jobs import Job, JobKind
from agent.deploy.ledger import Ledger
from agent.deploy.machine import Deployment, Machine, Options, Outcome, State
from agent.deploy.slots import Slots
from agent.deploy.sources import ArtifactFetcher
from agent.deploy.steps import Steps
from agent.deploy.trust import TrustStore
from agent.deploy.worker import Worker
from agent.errors import EdgeError, ProtocolError
from agent.guard import CrashLoopGuard, GuardPolicy, Verdict
from agent.hardware import probe_hardware
from agent.model_host import ModelHost
from agent.protocol import topics
from agent.protocol.envelope import COMMAND_TYPE, DESIRED_TYPE, KEY_ROTATION_TYPE, MANIFEST_TYPE, Envelope
from agent.protocol.manifest import Manifest
from agent.protocol.messages import (
    Command,
    DesiredState,
    DeviceEvent,
    Presence,
    check_addressed,
    verify_signed,
)
from agent.protocol.schema import encode_json
from agent.serving import InferenceServer, ModelRegistry
from agent.telemetry import device_metrics
from agent.tls import tls_context
from agent.transport import DeviceTransportFactory, Message, MqttTransport, Transport, Will

__all__ = ["Agent"]

log = logging.getLogger(__name__)


class Agent:
    def __init__(self, config: AgentConfig, pause_in: Callable[[State], None] | None = None,
                 transport: DeviceTransportFactory | None = None) -> None:
        """``transport`` builds the connection (default: MQTT to ``config.broker``); tests pass a MemoryBroker's."""
        self.config = config
        self.id = config.device_id
        self.state_dir = config.state_dir
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.inbox: queue.Queue[Message] = queue.Queue()
        self.stopping = threading.Event()
        self.rejected: Counter[str] = Counter()
        self._seen_reasons: set[str] = set()
        self.hardware = probe_hardware(config.hardware_root)
        self.registry = ModelRegistry()
        self.server = InferenceServer.from_settings(
            self.registry, config.inference,
            device_metrics=lambda: device_metrics(self.state_dir, config.hardware_root),
        )
        self.slots = Slots(self.state_dir)
        self.ledger = Ledger(self.state_dir)
        deploy = config.deploy
        self.guard = CrashLoopGuard(self.state_dir, GuardPolicy(deploy.crash_loop_max_deaths, deploy.crash_loop_window_s,
                                                                deploy.load_timeout_s))
        self._crash_loop: Verdict | None = None  # a rollback the guard made at start, reported once connected
        self.host = ModelHost(self.slots, self.registry, self.hardware, self.state_dir / "selection",
                              config.deploy.selection_budget_s, self.guard)
        controller_pems = config.trust.controllers or config.trust.packages
        # Pinned keys plus rotations accepted since (signed by a key trusted at the time).
        self.trust = TrustStore(self.state_dir, [p.read_text() for p in config.trust.packages],
                                [p.read_text() for p in controller_pems])
        self.package_keys, self.controller_keys = self.trust.keys("package"), self.trust.keys("controller")
        will = Will(topics.device(self.id, "presence"), Presence(self.id, False, time.time()).to_payload())
        self.transport: Transport = (transport or self._mqtt)(self.inbox, self._announce, will)
        # HTTP(S) Range from the desired state's URLs first, MQTT chunks for the rest (agent/deploy/sources.py).
        self.fetcher = ArtifactFetcher(
            ChunkFetcher(self.transport, self.id, config.deploy.request_interval_s, config.deploy.download_deadline_s),
            self.state_dir, HttpSettings(config.deploy.http_max_bytes_per_s, config.deploy.http_timeout_s, config.deploy.http_ca))
        steps = Steps(config.deploy, self.state_dir, self.slots, self.ledger, self.host,
                      self.fetcher.fetch, config.target)
        self.machine = Machine(self.state_dir / "deployment.json", steps.handlers(), self._report,
                               config.deploy.max_restarts_per_state, pause_in)
        self.worker = Worker(self.state_dir, self.machine, steps, self.slots, self.host, self._event,
                             self._changed, self.stopping)

    def _mqtt(self, inbox: queue.Queue[Message], on_connect: Callable[[], None], will: Will) -> Transport:
        config = self.config
        return MqttTransport(
            config.broker, f"edge-agent-{self.id}", inbox=inbox,
            tls_context=tls_context(config.tls.ca, config.tls.cert, config.tls.key) if config.tls.ca else None,
            will=will, on_connect=on_connect, protocol=config.mqtt_protocol,
        )

    # -- lifecycle --------------------------------------------------------------------------------

    def run(self) -> None:
        """Serve until stop() (SIGTERM/SIGINT)."""
        safe = self.worker.recover()  # before serving: the pointer names a committed model again
        self.server.start()
        log.info("agent %s: inference API on %s", self.id, self.server.url)
        if safe:
            self._load_active()
        self.transport.subscribe(topics.device(self.id, "desired"), 1)
        self.transport.subscribe(topics.device(self.id, "commands"), 1)
        self._connect()
        self._report_crash_loop()
        self.worker.start()
        next_telemetry = time.monotonic()
        while not self.stopping.is_set():
            with contextlib.suppress(queue.Empty):
                self._dispatch(self.inbox.get(timeout=0.2))
            if time.monotonic() >= next_telemetry:
                self._publish_telemetry()
                next_telemetry = time.monotonic() + self.config.telemetry_interval_s
        self._shutdown()

    def stop(self) -> None:
        self.stopping.set()
        self.fetcher.cancel()

    def _connect(self) -> None:
        while not self.stopping.is_set():
            try:
                self.transport.connect()
                return
            except EdgeError as exc:
                log.warning("%s; retrying", exc)
                self.stopping.wait(2.0)

    def _shutdown(self) -> None:
        self.worker.join(timeout_s=5.0)  # let a step that is ending report (and mark it reported) before the link closes
        offline = (topics.device(self.id, "presence"), Presence(self.id, False, time.time()).to_payload())
        self.transport.close(final=offline)
        self.server.stop()
        self.host.unload()
        self.guard.stand_down()  # stopping on purpose is not the model's doing
        log.info("agent %s stopped", self.id)

    def _report_crash_loop(self) -> None:
        verdict, self._crash_loop = self._crash_loop, None
        if verdict is not None:
            gone = verdict.rolled_back
            self._event(verdict.deployment_id or "none", "rollback", "rolled-back", verdict.detail(),
                        {"model": gone.name, "version": gone.version, "crash_loop_deaths": verdict.deaths})

    def _load_active(self) -> None:
        self._crash_loop = self.guard.admit(self.slots)  # a model that killed the agent K times is not loaded again
        active = self.slots.active()
        if active is None:
            return
        try:
            self.host.load(active)
        except Exception as exc:  # the agent must come up even if its model no longer loads
            log.error("cannot serve the active model %s v%d: %s", active.name, active.version, exc)

    # -- messages ---------------------------------------------------------------------------------

    def _dispatch(self, message: Message) -> None:
        try:
            if message.topic.startswith(f"{topics.ROOT}/artifacts/"):
                artifact_id, index = topics.parse_artifact_chunk(message.topic)
                self.fetcher.feed(artifact_id, index, message.payload)
                return
            leaf = topics.parse_device_topic(message.topic)
            if leaf.device_id != self.id or leaf.leaf not in ("desired", "commands"):
                raise ProtocolError(f"unexpected topic {message.topic!r}")
            if leaf.leaf == "desired":
                self._on_desired(message.payload, message.retain)
            else:
                self._on_command(message.payload)
        except EdgeError as exc:
            self._reject(message.topic, exc)
        except Exception:  # a bug in a handler must not stop the message loop
            log.exception("message on %s could not be handled", message.topic)
            self.rejected["InternalError"] += 1

    def _reject(self, topic: str, exc: EdgeError) -> None:
        kind = type(exc).__name__
        self.rejected[kind] += 1
        reason = f"{topic}: {exc}"
        if reason not in self._seen_reasons:
            self._seen_reasons.add(reason)
            log.warning("rejected message on %s", reason)
        else:
            log.debug("rejected message on %s", reason)
        if topic.endswith("/desired") or topic.endswith("/commands"):
            self._event("none", "rejected", "rejected", str(exc))

    def _on_desired(self, raw: bytes, retained: bool) -> None:
        desired = DesiredState.from_payload(verify_signed(raw, self.controller_keys, DESIRED_TYPE))
        if retained and desired.seq <= self.ledger.last_seq and desired.device_id == self.id:
            # The broker hands back the retained desired state on every (re)connect: already handled.
            log.debug("ignoring retained desired state seq %d: already handled", desired.seq)
            return
        check_addressed(desired, self.id, self.ledger.last_seq)
        if desired.model is None:
            self.ledger.accept_seq(desired.seq)
            return
        try:
            manifest_bytes = self.package_keys.verify(desired.model.manifest, MANIFEST_TYPE)
            manifest = Manifest.from_bytes(manifest_bytes)
            if (manifest.name, manifest.version) != (desired.model.name, desired.model.version):
                raise ProtocolError("desired state names a different model than its signed manifest")
        except EdgeError:
            self.ledger.accept_seq(desired.seq)  # refused for good: its replay is refused as a replay
            raise
        self.fetcher.remember(manifest.payload.sha256, desired.model.urls)
        options = Options(bool(desired.options.get("allow_downgrade")), desired.shadow_min)
        self._queue(Job(JobKind.DEPLOY, desired.deployment_id, manifest_bytes, options), desired.seq)

    def _queue(self, job: Job, seq: int) -> None:
        """Save the job, then the sequence number: a message the device acknowledged is never lost.

        On a full disk the job cannot be saved: OperationFailed, nothing acknowledged, and the same
        message is taken again when it comes back (a retained desired state, on reconnect)."""
        job, superseded = self.worker.jobs.put(job)
        self.ledger.accept_seq(seq)
        for old in superseded:
            self._event(old.deployment_id, "done", "failed", f"superseded by deployment {job.deployment_id} before it started")
        running = self.worker.current
        if job.kind is JobKind.DEPLOY and running is not None and running.ticket != job.ticket:
            self.fetcher.cancel(running.manifest.payload.sha256)  # its download gives way to the newer desired state

    def _on_command(self, raw: bytes) -> None:
        envelope = Envelope.from_bytes(raw)
        if envelope.payload_type == KEY_ROTATION_TYPE:
            rotation = self.trust.apply(envelope)
            self.package_keys, self.controller_keys = self.trust.keys("package"), self.trust.keys("controller")
            now_trusted = ", ".join(self.trust.keys(rotation.role).ids())
            self._event("none", "key-rotation", "ok", f"{rotation.role} keys now {now_trusted}")
            return
        command = Command.from_payload(self.controller_keys.verify(envelope, COMMAND_TYPE))
        check_addressed(command, self.id, self.ledger.last_seq)
        if command.command == "rollback":  # model changes run on the worker, after what is queued before them
            self._queue(Job(JobKind.ROLLBACK, str(command.args.get("deployment_id") or "")), command.seq)
        elif command.command == "remeasure":
            self._queue(Job(JobKind.REMEASURE), command.seq)
        else:
            self.ledger.accept_seq(command.seq)
            self._changed()

    def _changed(self) -> None:
        """What the device serves may have changed: say so now, not at the next tick."""
        self._publish_state()
        self._publish_telemetry()

    # -- deployments ------------------------------------------------------------------------------

    def _report(self, deployment: Deployment) -> None:
        outcome = deployment.outcome or Outcome.FAILED
        status = outcome.value if deployment.state is State.DONE else "running"
        data = deployment.findings.report()
        m = deployment.manifest
        data.update(model=m.name, version=m.version)
        self._event(deployment.deployment_id, deployment.state.value, status, deployment.reason, data)
        if deployment.state in (State.DONE, State.HEALTH):
            self._publish_state()
        if deployment.state is State.DONE:
            self._publish_telemetry()  # the backend and model changed: report it now, not at the next tick

    def _event(self, deployment_id: str, state: str, status: str, detail: str, data: dict[str, Any] | None = None) -> None:
        event = DeviceEvent(self.id, deployment_id, state, status, detail, time.time(), data or {})
        self.transport.publish(topics.device(self.id, "events"), event.to_payload(), qos=1)

    # -- announcements ----------------------------------------------------------------------------

    def _announce(self) -> None:
        """Birth, presence and state, on every (re)connect; runs on the network thread, publishes only."""
        birth = {
            "device_id": self.id, "agent_version": __version__, "ts": time.time(),
            "hardware": self.hardware.summary(), "runtimes": runtime_versions(),
            "target": self.config.target, "tags": self.config.tags, "inference_url": self.server.url,
        }
        self.transport.publish(topics.device(self.id, "birth"), encode_json(birth), qos=1, retain=True)
        presence = Presence(self.id, True, time.time()).to_payload()
        self.transport.publish(topics.device(self.id, "presence"), presence, qos=1, retain=True)
        self._publish_state()

    def _publish_state(self) -> None:
        current = self.host.current
        deployment = self.worker.current
        state = {
            "device_id": self.id, "ts": time.time(),
            "active": current.summary() if current else None,
            "deployment": None if deployment is None else {
                "id": deployment.deployment_id, "state": deployment.state.value, "reason": deployment.reason,
            },
            "last_seq": self.ledger.last_seq,
        }
        self.transport.publish(topics.device(self.id, "state"), encode_json(state), qos=1, retain=True)

    def _publish_telemetry(self) -> None:
        current = self.host.current
        report = {
            "device_id": self.id, "ts": time.time(),
            "device": device_metrics(self.state_dir, self.config.hardware_root),
            "models": self.registry.telemetry(),
            "selection": current.selection.to_dict() if current else None,
            "rejected_messages": dict(self.rejected),
        }
        self.transport.publish(topics.device(self.id, "telemetry"), encode_json(report), qos=0)
