"""A controller and a fleet of light agents on one in-memory broker: rollouts of several models in a second or two.

The controller is the real service (``edgectl.controller.service.Controller``), the agents are
``edgectl sim``'s light agents (the agent's own edgecore intake, ledger and chunked download, a set
applied by ``edgectl.sim_sets``); only the broker is the in-memory seam
(``edgecore.transport_memory``). Rollouts are planned and recorded as ``edgectl deploy --fleet``
and the REST API record them (``edgectl.fleet.rollouts``), against the controller's store.
"""

from __future__ import annotations

import itertools
import json
import queue
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgecore.protocol import topics
from edgecore.protocol.envelope import Envelope, TrustedKeys
from edgecore.protocol.manifest import TargetInfo
from edgecore.transport import ConnectHook, Message, Transport
from edgecore.transport_memory import MemoryBroker
from edgectl.controller import FINAL, RolloutDevice, RolloutRow, SqliteStore
from edgectl.controller.planner import Plan
from edgectl.controller.service import Controller
from edgectl.controller.submit import submit_rollout
from edgectl.examples import tiny_classifier
from edgectl.fleet.inventory import store_records
from edgectl.fleet.rollouts import FleetRequest, plan_fleet_rollout, rollout_options
from edgectl.package import BuildOptions, Package, build_package, read_package
from edgectl.sim import SimAgent, SimFleet
from tests.fleet import wait_for

WAIT_S = 20.0


@dataclass
class Shelf:
    """Signed packages built once for every test that asks (building one costs seconds on the loaded 2-core box)."""

    root: Path
    key: Ed25519PrivateKey
    built: dict[tuple[str, int, str, int], Path] = field(default_factory=dict)

    def get(self, name: str, version: int, target: str = "any", seed: int = 0) -> Path:
        if (name, version, target, seed) not in self.built:
            out = self.root / f"{name}-{version}-{target}-{seed}.edgepkg"
            onnx = tiny_classifier(self.root / f"{name}-{version}-{seed}.onnx", size=8, seed=seed)
            build_package(onnx, BuildOptions(name, version, TargetInfo(target), golden_samples=0), self.key, out)
            self.built[(name, version, target, seed)] = out
        return self.built[(name, version, target, seed)]


@dataclass
class MemoryPlane:
    root: Path
    broker: MemoryBroker
    controller: Controller
    fleet: SimFleet
    shelf: Shelf
    thread: threading.Thread
    key: Ed25519PrivateKey  # the controller's signing key

    def restart_controller(self) -> None:
        """A new controller on the same store and broker (after ``controller.stop()``)."""
        self.thread.join(10)
        self.controller, self.thread = _controller(self.root, self.broker, self.key, self.shelf)

    @property
    def store(self) -> SqliteStore:
        store = self.controller.store
        assert isinstance(store, SqliteStore)
        return store

    def agents(self, *ids: str, profile: str = "cpu-x86", **kw: Any) -> list[SimAgent]:
        agents = [self.fleet.start(SimAgent(i, profile, self.root / "sim" / i, **kw)) for i in ids]
        wait_for(lambda: all((d := self.store.device(a.device_id)) is not None and d.birth is not None and d.state is not None
                             for a in agents), WAIT_S, "the agents in the store", interval=0.02)
        return agents

    def package(self, name: str, version: int, target: str = "any", seed: int = 0) -> Package:
        path = self.shelf.get(name, version, target, seed)
        work = self.root / "read" / path.stem
        work.mkdir(parents=True, exist_ok=True)
        return read_package(path, TrustedKeys([self.shelf.key.public_key()]), work)

    def plan(self, package: Package, selector: str = "all", **kw: Any) -> tuple[FleetRequest, Plan]:
        request = FleetRequest([package.path], selector, **{"waves": "100%", "bake": "0s", **kw})
        options = rollout_options(request, 30.0)
        records = store_records(self.store, selector)
        return request, plan_fleet_rollout(request, options, [package], records, self.store)

    def deploy(self, package: Package, selector: str = "all", **kw: Any) -> str:
        request, plan = self.plan(package, selector, **kw)
        return submit_rollout(self.store, plan, rollout_options(request, 30.0))

    def rollout(self, rollout_id: str) -> RolloutRow:
        found = self.store.rollout(rollout_id)
        assert found is not None
        return found

    def ended(self, rollout_id: str, timeout: float = WAIT_S) -> RolloutRow:
        wait_for(lambda: self.rollout(rollout_id).status in FINAL, timeout, f"{rollout_id} to end", interval=0.05)
        return self.rollout(rollout_id)

    def rows(self, rollout_id: str) -> dict[str, RolloutDevice]:
        return {r.device_id: r for r in self.store.rollout_devices(rollout_id)}

    def retained_desired(self, device_id: str) -> dict[str, Any]:
        """The desired state the broker keeps for a device, its payload read (the controller signed it)."""
        raw = self.broker.retained(topics.device(device_id, "desired"))
        assert raw is not None, f"no desired state retained for {device_id}"
        payload: dict[str, Any] = json.loads(Envelope.from_bytes(raw).payload)
        return payload

    def audit(self, rollout_id: str, device_id: str = "") -> list[tuple[str, str]]:
        return [(a.action, a.detail) for a in self.store.audit_log(rollout_id) if not device_id or a.device_id == device_id]


def served(agent: SimAgent) -> dict[str, int]:
    """The model versions a light agent serves, by name."""
    return {name: m.version for name, m in list(agent.models.items())}


def start_plane(root: Path, shelf: Shelf) -> MemoryPlane:
    """The controller in a thread on a fresh in-memory broker, and an empty fleet (stop it with :func:`stop_plane`)."""
    key = Ed25519PrivateKey.generate()
    broker = MemoryBroker()
    controller, thread = _controller(root, broker, key, shelf)
    fleet = SimFleet("memory://", TrustedKeys([shelf.key.public_key()]), TrustedKeys([key.public_key()]), telemetry_s=0.1,
                     transports=broker.factory)
    return MemoryPlane(root, broker, controller, fleet, shelf, thread, key)


def _controller(root: Path, broker: MemoryBroker, key: Ed25519PrivateKey, shelf: Shelf) -> tuple[Controller, threading.Thread]:
    names = itertools.count()
    prefix = f"controller-{len([c for c in broker.clients() if c.startswith('controller')])}"

    def connection(inbox: queue.Queue[Message], on_connect: ConnectHook) -> Transport:
        # A client id of its own per connection, as MqttTransport makes them: the controller opens a second one
        # to read retained reports (its reconciliation), which must not take over the first one's id.
        return broker.transport(f"{prefix}-{next(names)}", inbox, on_connect)

    controller = Controller(SqliteStore(root / "controller.db"), connection, key, TrustedKeys([shelf.key.public_key()]),
                            tick_s=0.05)
    thread = threading.Thread(target=controller.run, daemon=True)
    thread.start()
    wait_for(lambda: f"{prefix}-0" in broker.clients(), WAIT_S, "the controller to connect", interval=0.01)
    return controller, thread


def stop_plane(plane: MemoryPlane) -> threading.Thread:
    plane.fleet.stop()
    plane.controller.stop()
    return plane.thread
