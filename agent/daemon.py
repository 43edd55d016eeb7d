"""The edge-agent daemon: follows its desired set over MQTT, serves its models and pipelines, reports.

Threads: paho's network thread only enqueues; the main thread validates and dispatches messages
and publishes telemetry; one worker thread (agent.deploy.worker) makes every change to what is
served, desired sets, rollbacks and remeasurements, in the order they were accepted; a job is saved
before its message is acknowledged. A bad message is logged once with its reason, counted, and
ignored: it never stops the agent or touches a served model.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from agent import __version__
from agent.admission import Admission, default_budget_mb
from agent.catalog import runtime_versions
from agent.config import AgentConfig
from agent.deploy.jobs import Job, JobKind
from agent.deploy.machine import Deployment, Machine, Options, Outcome, State
from agent.deploy.plan import Wanted
from agent.deploy.slots import Slots
from agent.deploy.steps import Steps
from agent.deploy.window import WindowGate
from agent.deploy.worker import Worker
from agent.fleet_check import FleetCheck
from agent.footprint import FootprintBook, footprint_key
from agent.guard import CrashLoopGuard, GuardPolicy, Verdict
from agent.hardware import probe_hardware
from agent.hardware.runtimes import profile_report
from agent.idle_remeasure import DeviceActivity, IdleRemeasure, Remeasured
from agent.logs import LogRing
from agent.model_host import LoadedModel, ModelHost
from agent.remote_config import RemoteConfig, put_in_force
from agent.serving import InferenceServer, ModelRegistry
from agent.telemetry import device_metrics
from edgecore.compiled_cache import use_root
from edgecore.delivery.fetch import ChunkFetcher
from edgecore.delivery.http_fetch import HttpSettings
from edgecore.delivery.sources import ArtifactFetcher
from edgecore.errors import EdgeError, ProtocolError
from edgecore.protocol import topics
from edgecore.protocol.device_config import ConfigState
from edgecore.protocol.envelope import KEY_ROTATION_TYPE, Envelope
from edgecore.protocol.intake import Intake, SetOrder
from edgecore.protocol.ledger import Ledger
from edgecore.protocol.logs import LogQuery
from edgecore.protocol.manifest import manifest_sha256
from edgecore.protocol.messages import DESIRED_SCHEMAS
from edgecore.protocol.reporter import Reporter, presence_will
from edgecore.protocol.reports import Birth, DeploymentProgress, DeviceState, ModelTelemetry, RunningModel, Telemetry
from edgecore.protocol.trust import TrustStore
from edgecore.tls import tls_context
from edgecore.transport import DeviceTransportFactory, Message, MqttTransport, Transport, Will
from edgecore.windows import Windows, device_timezone, local_zone

__all__ = ["Agent"]

log = logging.getLogger(__name__)


class Agent:
    def __init__(self, config: AgentConfig, pause_in: Callable[[State], None] | None = None,
                 transport: DeviceTransportFactory | None = None) -> None:
        """``transport`` builds the connection (default: MQTT to ``config.broker``); tests pass a MemoryBroker's."""
        self.base_config = config  # agent.yaml; the controller's configuration overrides a few keys (agent/remote_config.py)
        self.remote_config = RemoteConfig(config.state_dir, config.device_id, lambda: self.trust.keys("controller"))
        self.config = config = self.remote_config.effective(config)
        self.id = config.device_id
        self.state_dir = config.state_dir
        self.state_dir.mkdir(parents=True, exist_ok=True)
        use_root(self.state_dir / "compiled")  # compiled-model caches, for this process and its measuring children
        self.inbox: queue.Queue[Message] = queue.Queue()
        self.stopping = threading.Event()
        self.rejected: Counter[str] = Counter()
        self._seen_reasons: set[str] = set()
        self.logs = LogRing()  # recent records for the signed logs command (agent/logs.py), on the root logger in run()
        self.hardware = probe_hardware(config.hardware_root)
        self.profiles = _profiles()  # the runtimes do not change while the agent runs: asked once, told at every birth
        self.timezone = device_timezone(config.timezone)  # maintenance windows are read in it; told at every birth
        self.registry = ModelRegistry()
        self.server = InferenceServer.from_settings(
            self.registry, config.inference,
            device_metrics=lambda: device_metrics(self.state_dir, config.hardware_root).to_json(),
        )
        if self.remote_config.applied is not None:  # the configuration saved before a restart is in force again
            put_in_force(config, self.server)
        self.slots = Slots(self.state_dir)
        self.ledger = Ledger(self.state_dir)
        deploy = config.deploy
        self.guard = CrashLoopGuard(self.state_dir, GuardPolicy(deploy.crash_loop_max_deaths, deploy.crash_loop_window_s,
                                                                deploy.load_timeout_s))
        self._crash_loop: list[Verdict] = []  # rollbacks the guard made at start, reported once connected
        self.host = ModelHost(self.slots, self.registry, self.hardware, self.state_dir / "selection",
                              config.deploy.selection_budget_s, self.guard)
        self.book = FootprintBook(self.state_dir / "footprints.json")
        budget = config.models.memory_budget_mb
        self.budget_mb = budget if budget is not None else default_budget_mb()
        self.admission = Admission(self.book, self.budget_mb, self._serving)
        controller_pems = config.trust.controllers or config.trust.packages
        # Pinned keys plus rotations accepted since (signed by a key trusted at the time).
        self.trust = TrustStore(self.state_dir, [p.read_text() for p in config.trust.packages],
                                [p.read_text() for p in controller_pems])
        # Signature, type, address, sequence and expiry of what the controller sends (edgecore/protocol/intake.py).
        self.intake = Intake(self.id, self.ledger, self.trust.keys)
        self.transport: Transport = (transport or self._mqtt)(self.inbox, self._announce, presence_will(self.id))
        self.reporter = Reporter(self.transport, self.id)
        # A broker that brings nothing signed by the controller within broker_check_s is left for the next URL.
        self.fleet_check = FleetCheck(self.id, self.transport, lambda: self.trust.keys("controller"),
                                      config.broker_check_s, self._left_broker)
        # HTTP(S) Range from the desired state's URLs first, MQTT chunks for the rest (edgecore/delivery/sources.py).
        self.fetcher = ArtifactFetcher(
            ChunkFetcher(self.transport, self.id, config.deploy.request_interval_s, config.deploy.download_deadline_s),
            self.state_dir, HttpSettings(deploy.http_max_bytes_per_s, deploy.http_timeout_s, deploy.http_ca,
                                         deploy.http_min_bytes_per_s, tuple(deploy.http_redirect_hosts),
                                         deploy.http_redirect_private), self._fell_back)
        steps = Steps(config.deploy, self.state_dir, self.slots, self.ledger, self.host,
                      self.fetcher.fetch, config.target, self.book)
        self.machine = Machine(self.state_dir / "deployment.json", steps.handlers(), self._report,
                               config.deploy.max_restarts_per_state, pause_in)
        activity = DeviceActivity(self.registry, lambda: bool(self.worker.jobs.pending()) or self.stopping.is_set(),
                                  config.remeasure)
        self.remeasure = IdleRemeasure(self.host, config.remeasure, activity, self._remeasured)
        self.worker = Worker(self.state_dir, self.machine, steps, self.slots, self.host, self._event,
                             self._changed, self.stopping, self.admission, on_idle=self.remeasure.tick,
                             drain_s=config.models.remove_drain_s, window=WindowGate(local_zone(self.timezone),
                                                                                  own=self._own_windows))

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
        logging.getLogger().addHandler(self.logs)
        unsafe = self.worker.recover()  # before serving: the pointer names committed models again
        self.server.start()
        log.info("agent %s: inference API on %s", self.id, self.server.url)
        self._load_active(unsafe)
        self.transport.subscribe(topics.device(self.id, "desired"), 1)
        self.transport.subscribe(topics.device(self.id, "commands"), 1)
        self.transport.subscribe(topics.device(self.id, "config"), 1)
        for topic in self.fleet_check.topics:
            self.transport.subscribe(topic, 1)
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
            self._check_broker()
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

    def _check_broker(self) -> None:
        """Leave a broker that is not the fleet's (agent/fleet_check.py); when no other answers, keep trying them all."""
        try:
            self.fleet_check.tick()
        except EdgeError as exc:
            log.warning("%s; retrying", exc)
            self._connect()

    def _left_broker(self, reason: str, waited_s: float) -> None:
        """Connected to the next broker after leaving one that is not the fleet's: say so there."""
        self._event("none", "broker", "moved", reason, {"waited_s": round(waited_s, 1), "moves": self.fleet_check.moves})

    def _shutdown(self) -> None:
        self.worker.join(timeout_s=5.0)  # let a step that is ending report (and mark it reported) before the link closes
        self.transport.close(final=self.reporter.goodbye())
        self.server.stop()
        self.host.unload_all()
        self.guard.stand_down()  # stopping on purpose is not the model's doing
        logging.getLogger().removeHandler(self.logs)
        log.info("agent %s stopped", self.id)

    def _report_crash_loop(self) -> None:
        verdicts, self._crash_loop = self._crash_loop, []
        for verdict in verdicts:
            gone = verdict.rolled_back
            self._event(verdict.deployment_id or "none", "rollback", "rolled-back", verdict.detail(),
                        {"model": gone.name, "version": gone.version, "crash_loop_deaths": verdict.deaths}, gone.name)

    def _load_active(self, unsafe: frozenset[str]) -> None:
        """Serve every active model, then every pipeline over them; ``unsafe`` names wait for their rollback."""
        self._crash_loop = self.guard.admit(self.slots)  # a model that killed the agent K times is not loaded again
        actives = sorted(self.slots.actives().values(), key=lambda a: (a.kind == "pipeline", a.name))
        for active in actives:
            if active.name in unsafe:
                continue
            try:
                self.host.load_pipeline(active) if active.kind == "pipeline" else self.host.load(active)
            except Exception as exc:  # the agent must come up even if a model no longer loads
                log.error("cannot serve the active %s %s v%d: %s", active.kind, active.name, active.version, exc)

    # -- messages ---------------------------------------------------------------------------------

    def _dispatch(self, message: Message) -> None:
        try:
            self.fleet_check.saw(message)  # a beacon or this device's desired state: the broker is the fleet's
            if message.topic == topics.FLEET_BEACON:
                return
            if message.topic.startswith(f"{topics.ROOT}/artifacts/"):
                artifact_id, index = topics.parse_artifact_chunk(message.topic)
                self.fetcher.feed(artifact_id, index, message.payload)
                return
            leaf = topics.parse_device_topic(message.topic)
            if leaf.device_id != self.id or leaf.leaf not in ("desired", "commands", "config"):
                raise ProtocolError(f"unexpected topic {message.topic!r}")
            if leaf.leaf == "desired":
                self._on_desired(message.payload, message.retain)
            elif leaf.leaf == "config":
                self._on_config(message.payload, message.retain)
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
        if topic.endswith(("/desired", "/commands", "/config")):
            self._event("none", "rejected", "rejected", str(exc))

    def _on_desired(self, raw: bytes, retained: bool) -> None:
        order = self.intake.desired_set(raw, retained)
        if order is None:  # nothing to do: schema 1's "keep what you have", or the retained one handed back on a reconnect
            return
        for verified in order.entries:
            self.fetcher.remember(verified.manifest.payload.sha256, verified.entry.urls)
        wanted = tuple(Wanted(v.entry.deployment_id, v.manifest_bytes,
                              Options(v.entry.options.allow_downgrade, v.entry.options.shadow_min,
                                      v.entry.options.maintenance)) for v in order.entries)
        self._queue(Job(JobKind.DEPLOY, order.desired.deployment_id, wanted), order.desired.seq, order)

    def _queue(self, job: Job, seq: int, order: SetOrder | None = None) -> None:
        """Save the job, then the sequence number: a message the device acknowledged is never lost.

        On a full disk the job cannot be saved: OperationFailed, nothing acknowledged, and the same
        message is taken again when it comes back (a retained desired state, on reconnect)."""
        job, superseded = self.worker.jobs.put(job, seq)
        self.ledger.accept_seq(seq)
        kept = {w.sha256 for w in job.wanted}
        for old in superseded:
            why = f"superseded by deployment {job.deployment_id} before it started"
            self._event(old.deployment_id, "done", "failed", why)
            for entry in old.wanted:  # an entry the newer set keeps is deployed under it instead
                if entry.sha256 not in kept and entry.deployment_id != old.deployment_id:
                    self._event(entry.deployment_id, "done", "failed", why, model=entry.name)
        running = self.worker.current
        if job.kind is JobKind.DEPLOY and running is not None and running.ticket != job.ticket:
            for part in running.parts:  # a download the newer set does not want gives way to it
                if manifest_sha256(part.manifest_bytes) not in kept:
                    self.fetcher.cancel(part.manifest.payload.sha256)

    def _on_command(self, raw: bytes) -> None:
        envelope = Envelope.from_bytes(raw)
        if envelope.payload_type == KEY_ROTATION_TYPE:
            rotation = self.trust.apply(envelope)
            now_trusted = ", ".join(self.trust.keys(rotation.role).ids())
            self._event("none", "key-rotation", "ok", f"{rotation.role} keys now {now_trusted}")
            return
        command = self.intake.command(envelope)
        model = str(command.args.get("model") or "")
        if command.command == "rollback":  # model changes run on the worker, after what is queued before them
            self._queue(Job(JobKind.ROLLBACK, str(command.args.get("deployment_id") or ""), model=model), command.seq)
        elif command.command == "remeasure":
            self._queue(Job(JobKind.REMEASURE, model=model), command.seq)
        elif command.command == "logs":  # read-only: answered here, on the device's logs topic
            query = LogQuery.from_args(command.args)
            self.ledger.accept_seq(command.seq)
            self.reporter.publish(self.logs.answer(self.id, query))
        else:
            self.ledger.accept_seq(command.seq)
            self._changed()

    def _on_config(self, raw: bytes, retained: bool) -> None:
        """A signed configuration: applied over agent.yaml, or refused with its reason (the one in force stays)."""
        status = self.remote_config.take(raw, retained)
        if status is None:
            return
        if status.status is ConfigState.APPLIED:
            self.config = self.remote_config.effective(self.base_config)
            put_in_force(self.config, self.server)
        self._event("none", "config", status.status.value,
                    status.reason or f"configuration version {status.version} in force", status.to_json())
        self.reporter.publish(self._birth())  # its tags may have changed
        self._publish_state()

    def _changed(self) -> None:
        """What the device serves may have changed: say so now, not at the next tick."""
        self._publish_state()
        self._publish_telemetry()

    # -- deployments ------------------------------------------------------------------------------

    def _report(self, deployment: Deployment) -> None:
        """One event per part of the unit, under that part's deployment id and naming its model."""
        outcome = deployment.outcome or Outcome.FAILED
        status = outcome.value if deployment.state is State.DONE else "running"
        unit = [p.name for p in deployment.parts]
        for part in deployment.parts:
            data = part.findings.report()
            data.update(model=part.name, version=part.manifest.version, kind=part.manifest.kind)
            if len(unit) > 1:
                data["unit"] = unit
            self._event(part.deployment_id, deployment.state.value, status, deployment.reason, data, part.name)
        if deployment.state in (State.DONE, State.HEALTH):
            self._publish_state()
        if deployment.state is State.DONE:
            self._publish_telemetry()  # the backend and model changed: report it now, not at the next tick

    def _remeasured(self, result: Remeasured) -> None:
        """A background re-measurement ended (agent.idle_remeasure): report it; a switch changes what serves."""
        self._event("none", "remeasure", result.outcome, result.detail[:1000], result.to_dict(), result.model)
        if result.outcome == "switched":
            self._changed()

    def _fell_back(self, artifact_id: str, why: str) -> None:
        """HTTP could not bring the whole artifact: the download goes on over MQTT, and the event says why."""
        current = self.worker.current
        self._event(current.deployment_id if current else "none", "download", "running", why,
                    {"artifact_id": artifact_id, "source": "mqtt"})

    def _event(self, deployment_id: str, state: str, status: str, detail: str, data: dict[str, Any] | None = None,
               model: str | None = None) -> None:
        self.reporter.event(deployment_id, state, status, detail, data, model)

    # -- announcements ----------------------------------------------------------------------------

    def _announce(self) -> None:
        """Birth, presence and state, on every (re)connect; runs on the network thread, publishes only."""
        self.fleet_check.connected()
        self.reporter.announce(self._birth(), self._state())

    def _birth(self) -> Birth:
        return Birth(self.id, time.time(), __version__, self.config.target, dict(self.config.tags), self.server.url,
                     self.hardware.summary(), runtime_versions(), self.profiles, DESIRED_SCHEMAS, self.timezone,
                     tuple(self._own_windows().texts()))

    def _own_windows(self) -> Windows:
        """This device's own maintenance windows, as the configuration in force says now (checked when loaded)."""
        return Windows.parse(self.config.maintenance_windows)

    def _serving(self) -> dict[str, tuple[str, str]]:
        """Per name served: the sha256 of its signed manifest and its backend (what admission counts)."""
        return {name: (served.active.manifest_sha256, served.backend) for name, served in self.host.served().items()}

    def _running(self) -> tuple[RunningModel, ...]:
        """Every model and pipeline served, with its backend and measured footprints, sorted by name."""
        running = []
        for name, served in sorted(self.host.served().items()):
            active, figures = served.active, self.book.get(footprint_key(served.manifest))
            members = tuple(served.manifest.pipeline.models) if served.manifest.pipeline else ()
            running.append(RunningModel(name, active.version, served.manifest.artifact_id, served.backend, active.slot,
                                        active.kind, active.deployment_id or None, _footprint(figures, served.backend),
                                        figures, members))
        return tuple(running)

    def _state(self) -> DeviceState:
        deployment = self.worker.current
        progress = None if deployment is None else DeploymentProgress(deployment.deployment_id, deployment.state.value,
                                                                      deployment.reason)
        # A queued job's message is accepted once its job is saved (the ledger follows a moment later, while the worker
        # may already have run it and reported): the state says the higher of the two.
        last_seq = max(self.ledger.last_seq, self.worker.jobs.accepted_seq)
        return DeviceState.of_set(self.id, time.time(), self._running(), progress, last_seq, self.budget_mb,
                                 self.remote_config.status)

    def _publish_state(self) -> None:
        self.reporter.publish(self._state())

    def _publish_telemetry(self) -> None:
        served = self.host.served()
        models = {}
        # The registry's figures are plain dicts because /metrics serves them too; read here into the report's types.
        for name, stats in self.registry.telemetry().items():
            figure = ModelTelemetry.from_json(stats)
            loaded = served.get(name)
            if loaded is not None:
                footprints = self.book.get(footprint_key(loaded.manifest))
                selection = loaded.selection.to_dict() if isinstance(loaded, LoadedModel) else None
                figure = dataclasses.replace(figure, kind=loaded.active.kind, selection=selection,
                                             footprint_mb=_footprint(footprints, loaded.backend))
            models[name] = figure
        only = [m for m in served.values() if isinstance(m, LoadedModel)]
        self.reporter.publish(Telemetry(
            self.id, time.time(), device_metrics(self.state_dir, self.config.hardware_root), models,
            only[0].selection.to_dict() if len(served) == 1 and only else None, dict(self.rejected)))


def _footprint(figures: dict[str, float], backend: str) -> float | None:
    """The footprint on ``backend``, else the most any backend took (admission's rule, agent.admission.cost_of)."""
    return figures.get(backend, max(figures.values(), default=None))


def _profiles() -> dict[str, dict[str, Any]]:
    """Per target profile, whether this device's runtimes run it (empty, and logged, when a profile is broken)."""
    try:
        return profile_report()
    except EdgeError as exc:
        log.warning("cannot tell which target profiles the runtimes here run: %s", exc)
        return {}
