"""Simulated agents for trying rollouts without hardware: many light agents in one process.

The device side of the protocol is the agent's own edgecore code, per agent: its MQTT connection
(edgecore.transport, with last will and reconnects), its reports (edgecore.protocol.reporter and
the typed reports), the checks of what the controller sends (edgecore.protocol.intake: signature,
address, sequence, expiry, the signed manifests, and why a manifest is refused: expiry, agent
version, target, downgrade), the ledger (edgecore.protocol.ledger), artifact download with hash
checks of every chunk (edgecore.delivery.sources: by HTTP(S) Range from the desired state's
``urls`` first, then MQTT chunks for what is missing) and payload extraction with per-file
hash checks. An agent runs a set of models (desired-state schema 2, applied by
:mod:`edgectl.sim_sets`: admission against its memory budget, one deployment per changed entry,
removal); one told it speaks schema 1 only (``schemas``) refuses a set, as agents from before sets do,
and replaces its one model with each desired state.
Simulated: the hardware (a summary per profile), loading and running the model (the "health
check" reads the package's golden outputs and fails on NaN/inf; latency is the profile's base
latency times the agent's latency factor for that model version), the backend choice (the
profile's first execution provider, or the CPU when the agent is told to fall back), the shadow
run's agreement (the agent's ``agreement`` for that model version, 1.0 unless told), each model's
footprint (``footprint`` for that model version, else the size of its model files) and timing.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import queue
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgecore import __version__
from edgecore.delivery.fetch import ChunkFetcher
from edgecore.delivery.http_fetch import HttpSettings
from edgecore.delivery.sources import ArtifactFetcher
from edgecore.errors import EdgeError
from edgecore.protocol import topics
from edgecore.protocol.envelope import Envelope, TrustedKeys
from edgecore.protocol.intake import Intake, SetOrder, Verified
from edgecore.protocol.ledger import Ledger
from edgecore.protocol.manifest import Manifest
from edgecore.protocol.messages import DESIRED_SCHEMAS
from edgecore.protocol.reporter import Reporter, presence_will
from edgecore.protocol.reports import (
    Birth,
    DeploymentProgress,
    DeviceMetrics,
    DeviceState,
    LatencyFigures,
    ModelTelemetry,
    RunningModel,
    Telemetry,
)
from edgecore.protocol.schema import Fields
from edgecore.transport import ConnectHook, DeviceTransportFactory, Message, MqttTransport, Transport, Will
from edgectl.sim_sets import MIB, Measured, Served, SetRunner, weights_mb

__all__ = ["BASE_LATENCY_MS", "SimAgent", "SimFleet"]

log = logging.getLogger(__name__)

BASE_LATENCY_MS = {"jetson-orin": 2.0, "jetson-nano": 6.0, "nnapi": 8.0, "qnn-htp": 3.0, "cpu-x86": 5.0, "cpu-arm": 12.0}
SIM_MEMORY = 4 << 30  # bytes of memory a simulated device reports
BACKEND = {"jetson-orin": "TensorrtExecutionProvider", "nnapi": "NnapiExecutionProvider", "qnn-htp": "QNNExecutionProvider"}


_CHUNKS = f"{topics.ROOT}/artifacts/"


@dataclass
class SimAgent:
    device_id: str
    profile: str
    state_dir: Path
    latency_factor: dict[str, float] = field(default_factory=dict)  # "name@version" or "*" -> factor
    agreement: dict[str, float] = field(default_factory=dict)  # shadow-run agreement, "name@version" or "*" -> fraction
    tags: dict[str, str] = field(default_factory=dict)
    fallback: bool = False
    schemas: tuple[int, ...] = DESIRED_SCHEMAS  # (1,): an agent from before sets (one model, refuses a set)
    memory_budget_mb: float | None = SIM_MEMORY / MIB  # None: an agent from before admission (reports none)
    footprint: dict[str, float] = field(default_factory=dict)  # "name@version" or "*" -> MiB; default its model files
    timezone: str | None = "UTC"  # reported in the birth; it installs when sent (the controller times its windows)
    transport: Transport | None = None
    served: Served = field(default_factory=Served)
    requests: dict[str, int] = field(default_factory=dict)  # per model, since it was installed

    @property
    def models(self) -> dict[str, RunningModel]:
        """What the agent serves, by name."""
        return self.served.models

    @property
    def active(self) -> RunningModel | None:
        """The model it serves when it serves exactly one."""
        return next(iter(self.models.values())) if len(self.models) == 1 else None

    def factor(self, name: str, version: int) -> float:
        return self.latency_factor.get(f"{name}@{version}", self.latency_factor.get("*", 1.0))

    def p95(self, name: str, version: int) -> float:
        return round(BASE_LATENCY_MS.get(self.profile, 5.0) * self.factor(name, version), 3)

    def measure(self, manifest: Manifest) -> Measured:
        """The simulated figures of a model installed here."""
        key = f"{manifest.name}@{manifest.version}"
        footprint = self.footprint.get(key, self.footprint.get("*", round(weights_mb(manifest), 3)))
        backend = "pipeline" if manifest.kind == "pipeline" else self.backend
        return Measured(backend, footprint, self.p95(manifest.name, manifest.version))

    def device_metrics(self, now: float) -> DeviceMetrics:
        """Simulated CPU and memory (for the console's charts): busier with a model, a slow swing per device."""
        swing = float(np.sin(now / 30 + sum(self.device_id.encode()) % 60))
        busy = 25.0 if self.models else 4.0
        memory = (0.45 if self.models else 0.3) + 0.02 * swing
        return DeviceMetrics(cpu_percent=round(busy + 3 * swing, 1), memory_total_bytes=SIM_MEMORY,
                             memory_used_bytes=int(SIM_MEMORY * memory), memory_percent=round(100 * memory, 1), simulated=True)

    @property
    def backend(self) -> str:
        return f"onnxruntime/{'CPUExecutionProvider' if self.fallback else BACKEND.get(self.profile, 'CPUExecutionProvider')}"


@dataclass(frozen=True)
class _Link:
    """One agent's device side of the protocol: the same edgecore parts the real agent runs."""

    reporter: Reporter
    ledger: Ledger
    intake: Intake
    fetcher: ArtifactFetcher
    runner: SetRunner


class _Route(queue.Queue):  # type: ignore[type-arg]
    """The inbox handed to one agent's transport: tags each message with its agent for the shared dispatcher.

    A chunk is also announced to the agent's fetcher right away, on the agent's network thread: with
    many agents behind one dispatcher, a chunk can wait there longer than the request interval, and
    it must not count as missing meanwhile (asking again would make the whole wave receive it twice)."""

    def __init__(self, agent: SimAgent, shared: queue.Queue[tuple[SimAgent, Message]]) -> None:
        super().__init__()
        self.agent, self.shared = agent, shared
        self.fetcher: ArtifactFetcher | None = None

    def put(self, item: Message, block: bool = True, timeout: float | None = None) -> None:
        if self.fetcher is not None and item.topic.startswith(_CHUNKS):
            with contextlib.suppress(EdgeError):  # the dispatcher drops it
                self.fetcher.heard(*topics.parse_artifact_chunk(item.topic))
        self.shared.put((self.agent, item))


class SimFleet:
    """Runs simulated agents against one broker: one dispatcher thread, one telemetry thread.

    ``http`` are the agents' settings for artifact URLs (CA bundle, rate cap, timeout), as the real
    agent's ``deploy.http_*``. ``telemetry_sent`` counts the reports published per wall-clock second.
    ``transports`` (client id -> a device transport factory) is the seam for an in-memory broker
    (``MemoryBroker.factory``); by default each agent connects to ``broker_url``."""

    def __init__(self, broker_url: str, package_keys: TrustedKeys, controller_keys: TrustedKeys,
                 telemetry_s: float = 1.0, http: HttpSettings | None = None,
                 transports: Callable[[str], DeviceTransportFactory] | None = None, tls: ssl.SSLContext | None = None) -> None:
        self.url = broker_url
        self.tls = tls  # the fleet PKI's identity for mqtts:// brokers (edgectl.yaml's tls:), as every edgectl command
        self.transports = transports or self._mqtt
        self.keys = {"package": package_keys, "controller": controller_keys}
        self.telemetry_s = telemetry_s
        self.http = http or HttpSettings()
        self.agents: dict[str, SimAgent] = {}
        self.inbox: queue.Queue[tuple[SimAgent, Message]] = queue.Queue()
        self.stopping = threading.Event()
        self.telemetry_sent: collections.Counter[int] = collections.Counter()
        self._links: dict[str, _Link] = {}
        threading.Thread(target=self._dispatch, name="sim-dispatch", daemon=True).start()
        threading.Thread(target=self._telemetry, name="sim-telemetry", daemon=True).start()

    def start(self, agent: SimAgent) -> SimAgent:
        agent.state_dir.mkdir(parents=True, exist_ok=True)
        agent.served.one_slot = 2 not in agent.schemas
        _restore(agent.served, agent.state_dir / "sim.json")  # a restart keeps what it served
        route = _Route(agent, self.inbox)
        transport = agent.transport = self.transports(f"sim-{agent.device_id}")(route, lambda: self._announce(agent),
                                                                                 presence_will(agent.device_id))
        ledger = Ledger(agent.state_dir)
        route.fetcher = ArtifactFetcher(ChunkFetcher(transport, agent.device_id, 1.0, 600.0), agent.state_dir, self.http)
        reporter = Reporter(transport, agent.device_id)

        def event(deployment_id: str, state: str, status: str, detail: str, data: dict[str, Any] | None,
                  model: str | None) -> None:
            reporter.event(deployment_id, state, status, detail, data, model)

        runner = SetRunner(agent.served, ledger, route.fetcher, agent.state_dir, agent.profile, agent.memory_budget_mb, event,
                           agent.measure, lambda manifest, wanted: _shadow(agent, manifest, wanted))
        self._links[agent.device_id] = _Link(reporter, ledger, Intake(agent.device_id, ledger, self.keys.__getitem__),
                                             route.fetcher, runner)
        transport.subscribe(topics.device(agent.device_id, "desired"), 1)
        transport.subscribe(topics.device(agent.device_id, "commands"), 1)
        self.agents[agent.device_id] = agent
        transport.connect()
        return agent

    def _mqtt(self, client_id: str) -> DeviceTransportFactory:
        def connect(inbox: queue.Queue[Message], on_connect: ConnectHook, will: Will) -> Transport:
            return MqttTransport(self.url, client_id, inbox=inbox, will=will, on_connect=on_connect, keepalive=10,
                                 tls_context=self.tls)
        return connect

    def kill(self, device_id: str) -> None:
        """Stop an agent without a goodbye: it just goes silent (the broker sends its will later)."""
        agent = self.agents.pop(device_id)
        self._links[device_id].fetcher.cancel()
        assert agent.transport is not None
        agent.transport.abort()  # no DISCONNECT: the socket stays half-open until keepalive

    def stop(self, device_id: str | None = None) -> None:
        for agent in [self.agents.pop(device_id)] if device_id else list(self.agents.values()):
            link = self._links[agent.device_id]
            link.fetcher.cancel()
            if agent.transport is not None:
                agent.transport.close(final=link.reporter.goodbye())
        if device_id is None:
            self.agents.clear()
            self.stopping.set()

    # -- reports ----------------------------------------------------------------------------------

    def _announce(self, agent: SimAgent) -> None:
        birth = Birth(agent.device_id, time.time(), __version__, agent.profile, dict(agent.tags), None,
                      {"simulated": True, "profile": agent.profile}, desired_schemas=agent.schemas, timezone=agent.timezone)
        self._links[agent.device_id].reporter.announce(birth, self._state(agent))

    def _state(self, agent: SimAgent) -> DeviceState:
        deploying = agent.served.deploying
        deployment = DeploymentProgress(deploying, "running") if deploying else None
        return DeviceState.of_set(agent.device_id, time.time(), tuple(agent.models.values()), deployment,
                                  self._links[agent.device_id].ledger.last_seq, agent.memory_budget_mb)

    def _publish_state(self, agent: SimAgent) -> None:
        self._links[agent.device_id].reporter.publish(self._state(agent))
        kept = {"models": [m.to_json() for m in agent.models.values()],
                "previous": {n: None if m is None else m.to_json() for n, m in agent.served.previous.items()}}
        (agent.state_dir / "sim.json").write_text(json.dumps(kept))

    def _event(self, agent: SimAgent, deployment_id: str, state: str, status: str, detail: str,
               data: dict[str, Any] | None = None, model: str | None = None) -> None:
        self._links[agent.device_id].reporter.event(deployment_id, state, status, detail, data, model)

    def _telemetry(self) -> None:
        while not self.stopping.wait(self.telemetry_s):
            for agent in list(self.agents.values()):
                now = time.time()
                self._links[agent.device_id].reporter.publish(Telemetry(agent.device_id, now, agent.device_metrics(now),
                                                                        _served(agent)))
                self.telemetry_sent[int(time.time())] += 1

    # -- messages -----------------------------------------------------------------------------------

    def _dispatch(self) -> None:
        while not self.stopping.is_set():
            try:
                agent, message = self.inbox.get(timeout=0.5)
            except queue.Empty:
                continue
            if agent.device_id not in self.agents:
                continue
            try:
                if message.topic.startswith(_CHUNKS):
                    artifact_id, index = topics.parse_artifact_chunk(message.topic)
                    self._links[agent.device_id].fetcher.feed(artifact_id, index, message.payload)
                elif message.topic.endswith("/desired"):
                    self._on_desired(agent, message.payload, message.retain)
                elif message.topic.endswith("/commands"):
                    self._on_command(agent, message.payload)
            except EdgeError as exc:
                log.info("%s rejected %s: %s", agent.device_id, message.topic, exc)
                if not message.topic.startswith(_CHUNKS):
                    self._event(agent, "none", "rejected", "rejected", str(exc))

    def _on_desired(self, agent: SimAgent, raw: bytes, retained: bool) -> None:
        link = self._links[agent.device_id]
        order = self._order(agent, link, raw, retained)
        if order is None:
            return
        link.ledger.accept_seq(order.desired.seq)  # nothing to keep first: the light agent acts on it at once
        agent.served.latest_seq = max(agent.served.latest_seq, order.desired.seq)
        for verified in order.entries:
            link.fetcher.remember(verified.manifest.payload.sha256, verified.entry.urls)
        threading.Thread(target=self._apply, args=(agent, order), daemon=True).start()

    @staticmethod
    def _order(agent: SimAgent, link: _Link, raw: bytes, retained: bool) -> SetOrder | None:
        """The verified set; an agent from before sets reads schema 1 only (it refuses a set) as the set of its model."""
        if 2 in agent.schemas:
            return link.intake.desired_set(raw, retained)
        order = link.intake.desired(raw, retained)
        if order is None:
            return None
        desired = order.desired.as_set()
        assert desired is not None  # an order always carries a model
        return SetOrder(desired, (Verified(desired.models[0], order.manifest, order.manifest_bytes),), ())

    def _apply(self, agent: SimAgent, order: SetOrder) -> None:
        try:
            self._links[agent.device_id].runner.apply(order)
        finally:
            for name in agent.models:
                agent.requests.setdefault(name, 0)
            self._publish_state(agent)

    def _on_command(self, agent: SimAgent, raw: bytes) -> None:
        link = self._links[agent.device_id]
        command = link.intake.command(Envelope.from_bytes(raw))
        link.ledger.accept_seq(command.seq)
        if command.command == "rollback":
            deployment_id = str(command.args.get("deployment_id", "none"))
            model = command.args.get("model")
            name = agent.served.roll_back(deployment_id, model if isinstance(model, str) else None)
            if name is not None:
                agent.requests.pop(name, None)
                self._event(agent, deployment_id, "rollback", "rolled-back", "rolled back on command", {}, name)
        self._publish_state(agent)


def _shadow(agent: SimAgent, manifest: Manifest, wanted: float) -> tuple[dict[str, Any], str | None]:
    """The simulated shadow run: reports the agreement the agent was given; too little refuses the cut-over."""
    agreement = agent.agreement.get(f"{manifest.name}@{manifest.version}", agent.agreement.get("*", 1.0))
    report = {"agreement": agreement, "samples": 16, "live": 0, "min_agreement": wanted, "first_difference": ""}
    if agreement < wanted:
        return report, f"shadow: the new model agrees with the serving one on {agreement:.1%} of 16 inputs, {wanted:.1%} needed"
    return report, None


def _served(agent: SimAgent) -> dict[str, ModelTelemetry]:
    """The simulated serving figures: ten requests more each report per model, latency from the profile."""
    figures = {}
    for name, m in list(agent.models.items()):
        agent.requests[name] = agent.requests.get(name, 0) + 10
        p95 = agent.p95(name, m.version)
        figures[name] = ModelTelemetry(str(m.version), m.backend or "", agent.requests[name], 0,
                                       LatencyFigures(p50=round(0.8 * p95, 3), p95=p95), kind=m.kind,
                                       footprint_mb=m.footprint_mb)
    return figures


def _restore(served: Served, saved: Path) -> None:
    """What a light agent served before a restart (also the list of [active, previous] earlier versions kept)."""
    if not saved.exists():
        return
    data = json.loads(saved.read_text())
    if isinstance(data, list):
        active, previous = (_kept(m) for m in data)
        served.models = {} if active is None else {active.name: active}
        served.previous = {} if active is None else {active.name: previous}
        return
    served.models = {m.name: m for m in (_kept(d) for d in data["models"]) if m is not None}
    served.previous = {n: _kept(d) for n, d in data["previous"].items()}


def _kept(data: Any) -> RunningModel | None:
    return None if data is None else RunningModel.read(Fields(data, "sim.json"))
