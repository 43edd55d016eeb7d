"""A controller service (in a thread or its own process), a simulated fleet, packages built in code."""

from __future__ import annotations

import dataclasses
import json
import queue
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgecore.protocol.envelope import TrustedKeys
from edgecore.protocol.manifest import TargetInfo
from edgecore.protocol.reports import RunningModel
from edgecore.transport import MqttTransport
from edgectl.controller import FINAL, RolloutDevice, RolloutRow, SqliteStore
from edgectl.controller.service import Controller
from edgectl.examples import tiny_classifier
from edgectl.keys import Keyring
from edgectl.package import BuildOptions, build_package
from edgectl.sim import SimAgent, SimFleet
from edgectl.sim_sets import Served
from tests.brokers import BrokerProcess
from tests.control.memory_plane import MemoryPlane, Shelf, start_plane, stop_plane
from tests.fleet import EdgectlHome, wait_for


@dataclass
class ControllerProcess:
    """``edgectl controller run`` in its own process, killable like a real deployment's."""

    home: EdgectlHome
    log: Path
    process: subprocess.Popen[bytes] | None = None
    prefix: list[str] = dataclasses.field(default_factory=list)  # run under it (`ip netns exec NAME`: it execs, same pid)

    def start(self) -> ControllerProcess:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen([*self.prefix, sys.executable, "-m", "edgectl.cli.main", "controller", "run"],
                                            env=self.home.env(), cwd=self.home.path, stdout=out, stderr=subprocess.STDOUT)
        return self

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(20)


@dataclass
class ControlPlane:
    home: EdgectlHome
    broker: BrokerProcess
    store_path: Path
    fleet: SimFleet
    controller: Controller | None = None
    thread: threading.Thread | None = None
    process: ControllerProcess | None = None

    def edgectl(self, *args: str, **kw: Any) -> Any:
        return self.home.edgectl(*args, **kw)

    def configure(self, config: dict[str, Any]) -> None:
        """Write the home's edgectl.yaml (the CLI runs in the home directory, where it looks first)."""
        (self.home.path / "edgectl.yaml").write_text(yaml.safe_dump(config))

    # -- the controller -----------------------------------------------------------------------------

    def start_controller(self) -> Controller:
        ring = Keyring(self.home.path / "keys")
        trusted = TrustedKeys([ring.signing_key("package").public_key()])
        url = self.home.broker_url

        def factory(inbox: queue.Queue[Any], hook: Any) -> MqttTransport:
            return MqttTransport(url, f"ctl-{uuid.uuid4().hex[:6]}", inbox=inbox, on_connect=hook)

        self.controller = Controller(SqliteStore(self.store_path), factory, ring.signing_key("controller"), trusted, tick_s=0.2)
        self.thread = threading.Thread(target=self.controller.run, daemon=True)
        self.thread.start()
        return self.controller

    def stop_controller(self) -> None:
        if self.controller is not None:
            self.controller.stop()
            assert self.thread is not None
            self.thread.join(10)
            self.controller = None
        if self.process is not None:
            self.process.stop()

    def controller_process(self) -> ControllerProcess:
        self.process = ControllerProcess(self.home, self.home.path.parent / "controller.log").start()
        return self.process

    # -- agents and packages ------------------------------------------------------------------------

    def agents(self, count: int, profile: str = "cpu-x86", prefix: str = "sim", **kw: Any) -> list[SimAgent]:
        root = self.home.path.parent / "sim"
        return [self.fleet.start(SimAgent(f"{prefix}-{i:03d}", profile, root / f"{prefix}-{i:03d}", **kw)) for i in range(count)]

    def restart_agent(self, agent: SimAgent) -> SimAgent:
        """The same device (id, profile, state directory) back after a stop or a kill."""
        fresh = dataclasses.replace(agent, transport=None, served=Served(), requests={})
        return self.fleet.start(fresh)

    def wait_devices(self, count: int, online: int | None = None) -> None:
        """Until `edgectl devices` lists ``count`` devices, ``online`` of them (default: all) online."""
        def ready() -> bool:
            rows = json.loads(self.edgectl("devices", "--json", check=True).stdout)
            return len(rows) == count and sum(d["status"] == "online" for d in rows) == (count if online is None else online)
        wait_for(ready, 30, f"{count} devices")

    def package(self, name: str, version: int, target: str = "any", model: Callable[[Path], Path] | None = None,
                **model_kw: Any) -> Path:
        """A signed package built in process (``edgectl build`` costs a process start per package).

        Golden data only for a ``model`` given on purpose (a NaN model): light agents load golden
        files in parallel threads, where numpy's header parsing (ast.literal_eval) sometimes fails
        with "SystemError: AST constructor recursion depth mismatch" on CPython 3.11 (gh-106905)."""
        onnx = self.home.path / f"{name}-{version}-{target}.onnx"
        model_path = model(onnx) if model is not None else tiny_classifier(onnx, **model_kw)
        out = self.home.path / f"{name}-{version}-{target}.edgepkg"
        options = BuildOptions(name, version, TargetInfo(target), golden_samples=1 if model is not None else 0)
        build_package(model_path, options, Keyring(self.home.path / "keys").signing_key("package"), out)
        return out

    # -- rollouts -----------------------------------------------------------------------------------

    def deploy(self, *args: str) -> str:
        result = self.edgectl("deploy", *args, "--json", check=True)
        return str(json.loads(result.stdout)["rollout_id"])

    def store(self) -> SqliteStore:
        return SqliteStore(self.store_path)

    def row(self, rollout_id: str) -> RolloutRow:
        found = self.store().rollout(rollout_id)
        assert found is not None, rollout_id
        return found

    def devices(self, rollout_id: str) -> dict[str, RolloutDevice]:
        return {r.device_id: r for r in self.store().rollout_devices(rollout_id)}

    def ended(self, rollout_id: str, timeout: float = 60) -> dict[str, Any]:
        """Wait for a final status in the store, then return `rollout status --json` (with the audit log)."""
        wait_for(lambda: self.row(rollout_id).status in FINAL, timeout, f"{rollout_id} to end")
        return self.rollout(rollout_id)

    def rollout(self, rollout_id: str) -> dict[str, Any]:
        summary: dict[str, Any] = json.loads(self.edgectl("rollout", "status", rollout_id, "--json", check=True).stdout)
        return summary

    def versions(self) -> dict[str, int | None]:
        """The model version each running light agent has active (None: nothing)."""
        return {a.device_id: a.active.version if a.active else None for a in list(self.fleet.agents.values())}


def active(agent: SimAgent) -> RunningModel:
    """The model a light agent serves; fails the test when it serves none."""
    assert agent.active is not None, f"{agent.device_id} serves no model"
    return agent.active


def audit_actions(summary: dict[str, Any], device_id: str = "") -> list[str]:
    return [a["action"] for a in summary["audit"] if not device_id or a["device_id"] == device_id]


@pytest.fixture
def plane(tmp_path: Path, mosquitto: BrokerProcess, home_for: Any) -> Iterator[ControlPlane]:
    home = home_for(tmp_path, mosquitto)
    ring = Keyring(home.path / "keys")
    fleet = SimFleet(mosquitto.url, TrustedKeys([ring.signing_key("package").public_key()]),
                     TrustedKeys([ring.signing_key("controller").public_key()]))
    cp = ControlPlane(home, mosquitto, home.path / "controller.db", fleet)
    yield cp
    cp.stop_controller()
    fleet.stop()


@pytest.fixture(scope="session")
def shelf(tmp_path_factory: pytest.TempPathFactory) -> Shelf:
    """Packages built once for the session's in-memory planes, signed by one package key."""
    return Shelf(tmp_path_factory.mktemp("shelf"), Ed25519PrivateKey.generate())


@pytest.fixture
def memory_plane(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stopping: list[threading.Thread],
                 shelf: Shelf) -> Iterator[MemoryPlane]:
    """A controller and light agents on an in-memory broker (tests/control/memory_plane.py)."""
    monkeypatch.setenv("EDGECTL_HOME", str(tmp_path / "home"))  # where signed messages take their sequence numbers
    (tmp_path / "home").mkdir()
    plane = start_plane(tmp_path, shelf)
    yield plane
    stopping.append(stop_plane(plane))
