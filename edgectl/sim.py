"""Simulated agents for trying rollouts without hardware: many light agents in one process.

Real, per agent: its own MQTT connection (agent.transport, with last will and reconnects), birth /
presence / state / events / telemetry in protocol v1, signature, address, sequence and expiry
checks (agent.protocol), the ledger (agent.deploy.ledger), artifact download with hash checks of
every chunk (agent.deploy.sources: by HTTP(S) Range from the desired state's ``model.urls`` first,
then MQTT chunks for what is missing, as the real agent) and payload extraction with per-file hash
checks.
Simulated: the hardware (a summary per profile), loading and running the model (the "health
check" reads the package's golden outputs and fails on NaN/inf; latency is the profile's base
latency times the agent's latency factor for that model version) and the backend choice (the
profile's first execution provider, or the CPU when the agent is told to fall back) and the
shadow run's agreement (the agent's ``agreement`` for that model version, 1.0 unless told).
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agent import __version__
from agent.deploy.download import Download
from agent.deploy.fetch import ChunkFetcher
from agent.deploy.golden import load_golden
from agent.deploy.http_fetch import HttpSettings
from agent.deploy.ledger import Ledger
from agent.deploy.sources import ArtifactFetcher
from agent.errors import EdgeError
from agent.protocol import topics
from agent.protocol.envelope import COMMAND_TYPE, DESIRED_TYPE, MANIFEST_TYPE, TrustedKeys
from agent.protocol.manifest import Manifest
from agent.protocol.messages import Command, DesiredState, DeviceEvent, Presence, check_addressed, verify_signed
from agent.protocol.package import extract_payload
from agent.protocol.schema import encode_json
from agent.transport import Message, MqttTransport, Transport, Will

__all__ = ["BASE_LATENCY_MS", "SimAgent", "SimFleet"]

log = logging.getLogger(__name__)

# numpy parses .npz headers with ast.literal_eval, which CPython 3.11 can break when several threads
# build ASTs at once ("AST constructor recursion depth mismatch", gh-106905): one at a time.
_GOLDEN_LOCK = threading.Lock()

BASE_LATENCY_MS = {"jetson-orin": 2.0, "jetson-nano": 6.0, "nnapi": 8.0, "qnn-htp": 3.0, "cpu-x86": 5.0, "cpu-arm": 12.0}
SIM_MEMORY = 4 << 30  # bytes of memory a simulated device reports
BACKEND = {"jetson-orin": "TensorrtExecutionProvider", "nnapi": "NnapiExecutionProvider", "qnn-htp": "QNNExecutionProvider"}


_CHUNKS = f"{topics.ROOT}/artifacts/"


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


@dataclass
class SimAgent:
    device_id: str
    profile: str
    state_dir: Path
    latency_factor: dict[str, float] = field(default_factory=dict)  # "name@version" or "*" -> factor
    agreement: dict[str, float] = field(default_factory=dict)  # shadow-run agreement, "name@version" or "*" -> fraction
    tags: dict[str, str] = field(default_factory=dict)
    fallback: bool = False
    transport: Transport | None = None
    active: dict[str, Any] | None = None
    previous: dict[str, Any] | None = None
    deploying: str | None = None
    requests: int = 0

    def factor(self, name: str, version: int) -> float:
        return self.latency_factor.get(f"{name}@{version}", self.latency_factor.get("*", 1.0))

    def p95(self) -> float | None:
        if self.active is None:
            return None
        return round(BASE_LATENCY_MS.get(self.profile, 5.0) * self.factor(self.active["name"], self.active["version"]), 3)

    def device_metrics(self, now: float) -> dict[str, Any]:
        """Simulated CPU and memory (for the console's charts): busier with a model, a slow swing per device."""
        swing = float(np.sin(now / 30 + sum(self.device_id.encode()) % 60))
        busy = 25.0 if self.active is not None else 4.0
        memory = (0.45 if self.active is not None else 0.3) + 0.02 * swing
        return {"simulated": True, "cpu_percent": round(busy + 3 * swing, 1), "memory_percent": round(100 * memory, 1),
                "memory_total_bytes": SIM_MEMORY, "memory_used_bytes": int(SIM_MEMORY * memory)}

    @property
    def backend(self) -> str:
        return f"onnxruntime/{'CPUExecutionProvider' if self.fallback else BACKEND.get(self.profile, 'CPUExecutionProvider')}"


class SimFleet:
    """Runs simulated agents against one broker: one dispatcher thread, one telemetry thread.

    ``http`` are the agents' settings for artifact URLs (CA bundle, rate cap, timeout), as the real
    agent's ``deploy.http_*``. ``telemetry_sent`` counts the reports published per wall-clock second."""

    def __init__(self, broker_url: str, package_keys: TrustedKeys, controller_keys: TrustedKeys,
                 telemetry_s: float = 1.0, http: HttpSettings | None = None) -> None:
        self.url = broker_url
        self.package_keys = package_keys
        self.controller_keys = controller_keys
        self.telemetry_s = telemetry_s
        self.http = http or HttpSettings()
        self.agents: dict[str, SimAgent] = {}
        self.inbox: queue.Queue[tuple[SimAgent, Message]] = queue.Queue()
        self.stopping = threading.Event()
        self.telemetry_sent: collections.Counter[int] = collections.Counter()
        self._fetchers: dict[str, ArtifactFetcher] = {}
        self._ledgers: dict[str, Ledger] = {}
        threading.Thread(target=self._dispatch, name="sim-dispatch", daemon=True).start()
        threading.Thread(target=self._telemetry, name="sim-telemetry", daemon=True).start()

    def start(self, agent: SimAgent) -> SimAgent:
        agent.state_dir.mkdir(parents=True, exist_ok=True)
        saved = agent.state_dir / "sim.json"
        if saved.exists():
            agent.active, agent.previous = json.loads(saved.read_text())
        will = Will(topics.device(agent.device_id, "presence"), Presence(agent.device_id, False, time.time()).to_payload())
        route = _Route(agent, self.inbox)
        agent.transport = MqttTransport(self.url, f"sim-{agent.device_id}", inbox=route, will=will,
                                        on_connect=lambda: self._announce(agent), keepalive=10)
        self._ledgers[agent.device_id] = Ledger(agent.state_dir)
        chunks = ChunkFetcher(agent.transport, agent.device_id, 1.0, 600.0)
        self._fetchers[agent.device_id] = route.fetcher = ArtifactFetcher(chunks, agent.state_dir, self.http)
        agent.transport.subscribe(topics.device(agent.device_id, "desired"), 1)
        agent.transport.subscribe(topics.device(agent.device_id, "commands"), 1)
        self.agents[agent.device_id] = agent
        agent.transport.connect()
        return agent

    def kill(self, device_id: str) -> None:
        """Stop an agent without a goodbye: it just goes silent (the broker sends its will later)."""
        agent = self.agents.pop(device_id)
        self._fetchers[device_id].cancel()
        assert agent.transport is not None
        agent.transport.abort()  # no DISCONNECT: the socket stays half-open until keepalive

    def stop(self, device_id: str | None = None) -> None:
        for agent in [self.agents.pop(device_id)] if device_id else list(self.agents.values()):
            self._fetchers[agent.device_id].cancel()
            if agent.transport is not None:
                goodbye = Presence(agent.device_id, False, time.time()).to_payload()
                agent.transport.close(final=(topics.device(agent.device_id, "presence"), goodbye))
        if device_id is None:
            self.agents.clear()
            self.stopping.set()

    # -- announcements ----------------------------------------------------------------------------

    def _announce(self, agent: SimAgent) -> None:
        birth = {"device_id": agent.device_id, "agent_version": __version__, "ts": time.time(),
                 "hardware": {"simulated": True, "profile": agent.profile}, "runtimes": {}, "target": agent.profile,
                 "tags": agent.tags, "inference_url": None}
        self._publish(agent, "birth", encode_json(birth), retain=True)
        self._publish(agent, "presence", Presence(agent.device_id, True, time.time()).to_payload(), retain=True)
        self._publish_state(agent)

    def _publish(self, agent: SimAgent, leaf: str, payload: bytes, retain: bool = False, qos: int = 1) -> None:
        if agent.transport is not None:
            agent.transport.publish(topics.device(agent.device_id, leaf), payload, qos=qos, retain=retain)

    def _publish_state(self, agent: SimAgent) -> None:
        state = {"device_id": agent.device_id, "ts": time.time(), "active": agent.active,
                 "deployment": {"id": agent.deploying, "state": "running", "reason": ""} if agent.deploying else None,
                 "last_seq": self._ledgers[agent.device_id].last_seq}
        self._publish(agent, "state", encode_json(state), retain=True)
        (agent.state_dir / "sim.json").write_text(json.dumps([agent.active, agent.previous]))

    def _event(self, agent: SimAgent, deployment_id: str, state: str, status: str, detail: str,
               data: dict[str, Any] | None = None) -> None:
        event = DeviceEvent(agent.device_id, deployment_id, state, status, detail, time.time(), data or {})
        self._publish(agent, "events", event.to_payload())

    def _telemetry(self) -> None:
        while not self.stopping.wait(self.telemetry_s):
            for agent in list(self.agents.values()):
                models = {}
                if agent.active is not None:
                    agent.requests += 10
                    p95 = agent.p95() or 0.0
                    models[agent.active["name"]] = {"version": str(agent.active["version"]), "backend": agent.active["backend"],
                                                    "requests": agent.requests, "errors": 0,
                                                    "latency_ms": {"p50": round(0.8 * p95, 3), "p95": p95}}
                now = time.time()
                report = {"device_id": agent.device_id, "ts": now, "device": agent.device_metrics(now), "models": models}
                self._publish(agent, "telemetry", encode_json(report), qos=0)
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
                if message.topic.startswith(f"{topics.ROOT}/artifacts/"):
                    artifact_id, index = topics.parse_artifact_chunk(message.topic)
                    self._fetchers[agent.device_id].feed(artifact_id, index, message.payload)
                elif message.topic.endswith("/desired"):
                    self._on_desired(agent, message.payload)
                elif message.topic.endswith("/commands"):
                    self._on_command(agent, message.payload)
            except EdgeError as exc:
                log.info("%s rejected %s: %s", agent.device_id, message.topic, exc)
                if not message.topic.startswith(f"{topics.ROOT}/artifacts/"):
                    self._event(agent, "none", "rejected", "rejected", str(exc))

    def _on_desired(self, agent: SimAgent, raw: bytes) -> None:
        ledger = self._ledgers[agent.device_id]
        desired = DesiredState.from_payload(verify_signed(raw, self.controller_keys, DESIRED_TYPE))
        if desired.seq <= ledger.last_seq:
            return
        check_addressed(desired, agent.device_id, ledger.last_seq)
        ledger.accept_seq(desired.seq)
        if desired.model is None:
            return
        manifest_bytes = self.package_keys.verify(desired.model.manifest, MANIFEST_TYPE)
        manifest = Manifest.from_bytes(manifest_bytes)
        self._fetchers[agent.device_id].remember(manifest.payload.sha256, desired.model.urls)
        active = agent.active
        new = (manifest.name, manifest.version, manifest.artifact_id)
        if active is not None and (active["name"], active["version"], active["artifact_id"]) == new:
            self._event(agent, desired.deployment_id, "commit", "ok", "already active")
            return
        threading.Thread(target=self._deploy, args=(agent, desired, manifest), daemon=True).start()

    def _deploy(self, agent: SimAgent, desired: DesiredState, manifest: Manifest) -> None:
        did, ledger = desired.deployment_id, self._ledgers[agent.device_id]
        data = {"model": manifest.name, "version": manifest.version}
        agent.deploying = did
        try:
            problem = self._refusal(agent, manifest, ledger, bool(desired.options.get("allow_downgrade")))
            if problem:
                return self._event(agent, did, "done", "failed", problem, data)
            self._event(agent, did, "download", "running", "", data)
            download = Download(agent.state_dir / "downloads", manifest.payload)
            self._fetchers[agent.device_id].fetch(download)
            self._event(agent, did, "verify", "running", "", data)
            slot = agent.state_dir / "slots" / manifest.artifact_id[:16]
            extract_payload(download.finish(), manifest, slot)
            download.discard()
            if desired.shadow_min is not None and agent.active is not None:
                refused = self._shadow(agent, did, manifest, desired.shadow_min, data)
                if refused:
                    return self._event(agent, did, "done", "failed", refused, data)
            self._event(agent, did, "health", "running", "", data)
            with _GOLDEN_LOCK:
                _, outputs = load_golden(slot / manifest.golden) if manifest.golden else ({}, {})
            if any(np.asarray(v).dtype.kind == "f" and not np.all(np.isfinite(v)) for v in outputs.values()):
                return self._event(agent, did, "done", "rolled-back", "health: the model produced NaN or infinite outputs", data)
            agent.previous, agent.active = agent.active, {"name": manifest.name, "version": manifest.version, "slot": slot.name,
                                                          "artifact_id": manifest.artifact_id, "backend": agent.backend}
            ledger.commit_version(manifest.name, manifest.version)
            agent.requests = 0
            data.update(backend=agent.backend, health_p95_ms=agent.p95())
            self._event(agent, did, "done", "ok", f"{manifest.name} v{manifest.version} committed", data)
        except EdgeError as exc:
            self._event(agent, did, "done", "failed", str(exc), data)
        finally:
            agent.deploying = None
            self._publish_state(agent)

    def _shadow(self, agent: SimAgent, did: str, manifest: Manifest, wanted: float, data: dict[str, Any]) -> str | None:
        """The simulated shadow run: reports the agreement the agent was given; too little refuses the cut-over."""
        agreement = agent.agreement.get(f"{manifest.name}@{manifest.version}", agent.agreement.get("*", 1.0))
        data["shadow"] = {"agreement": agreement, "samples": 16, "live": 0, "min_agreement": wanted, "first_difference": ""}
        self._event(agent, did, "shadow", "running", "", data)
        if agreement < wanted:
            return f"shadow: the new model agrees with the serving one on {agreement:.1%} of 16 inputs, {wanted:.1%} needed"
        return None

    @staticmethod
    def _refusal(agent: SimAgent, manifest: Manifest, ledger: Ledger, allow_downgrade: bool) -> str | None:
        if not manifest.target.accepts(agent.profile):
            return f"package is for target {manifest.target.name!r}, this device is {agent.profile!r}"
        if manifest.version < ledger.version(manifest.name) and not allow_downgrade:
            return f"version {manifest.version} of {manifest.name} is older than the accepted {ledger.version(manifest.name)}"
        return None

    def _on_command(self, agent: SimAgent, raw: bytes) -> None:
        ledger = self._ledgers[agent.device_id]
        command = Command.from_payload(verify_signed(raw, self.controller_keys, COMMAND_TYPE))
        check_addressed(command, agent.device_id, ledger.last_seq)
        ledger.accept_seq(command.seq)
        if command.command == "rollback":
            agent.active, agent.previous = agent.previous, None
            agent.requests = 0
            deployment_id = str(command.args.get("deployment_id", "none"))
            self._event(agent, deployment_id, "rollback", "rolled-back", "rolled back on command")
        self._publish_state(agent)
