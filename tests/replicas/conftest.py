"""Two `edgectl controller run` processes on one PostgreSQL store, a real Mosquitto, light agents.

Mosquitto logs every PUBLISH with the client id that sent it (``log_type all``); a controller's
client id carries its pid, so the broker itself tells which replica published what. A paho client
(:class:`Wire`) records every desired state, command and event that crossed the broker.
"""

from __future__ import annotations

import json
import re
import shutil
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from edgecore.protocol import topics
from edgecore.protocol.envelope import Envelope, TrustedKeys
from edgecore.protocol.manifest import TargetInfo
from edgectl.controller.records import AuditEntry, RolloutDevice, RolloutRow
from edgectl.controller.store import Store, open_url
from edgectl.examples import tiny_classifier
from edgectl.keys import Keyring
from edgectl.package import BuildOptions, build_package
from edgectl.sim import SimAgent, SimFleet
from tests.brokers import BrokerProcess, free_port, start_mosquitto
from tests.control.conftest import ControllerProcess
from tests.fleet import EdgectlHome, wait_for
from tests.postgres import PostgresCluster, start_cluster

__all__ = ["Replicas", "Wire", "open_replicas"]

LEAVES = ("desired", "commands", "events")


@dataclass
class Wire:
    """A paho client subscribed to every device's desired state, commands and events: what the devices received or sent."""

    url: str
    messages: list[tuple[str, bytes, bool]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._granted = threading.Event()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"wire-{uuid.uuid4().hex[:6]}", protocol=mqtt.MQTTv5)
        self.client.on_message = self._on_message
        self.client.on_subscribe = lambda *_: self._granted.set()
        host, port = self.url.removeprefix("mqtt://").rsplit(":", 1)
        self.client.connect(host, int(port))
        self.client.loop_start()
        self.client.subscribe([(topics.device("+", leaf), 1) for leaf in LEAVES])
        assert self._granted.wait(10), "the wire's subscription was not granted"

    def _on_message(self, _client: Any, _userdata: Any, message: mqtt.MQTTMessage) -> None:
        with self._lock:  # the network thread only appends
            self.messages.append((message.topic, bytes(message.payload), bool(message.retain)))

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()

    def received(self, leaf: str) -> list[tuple[str, dict[str, Any]]]:
        """(device id, JSON body) of each message on that leaf; signed ones are unwrapped (not verified)."""
        with self._lock:
            messages = list(self.messages)
        found = []
        for topic, payload, _retain in messages:
            if topic.endswith(f"/{leaf}"):
                body = json.loads(payload)
                if "payloadType" in body:
                    body = json.loads(Envelope.from_json(body).payload)
                found.append((topics.parse_device_topic(topic).device_id, body))
        return found


@dataclass
class Replicas:
    home: EdgectlHome
    broker: BrokerProcess
    url: str
    fleet: SimFleet
    wire: Wire
    cache: Path
    controllers: list[ControllerProcess] = field(default_factory=list)
    _store: Store | None = None

    def start_controller(self, name: str, counted_ahead_s: float = 0.0, prefix: Sequence[str] = (),
                         store_url: str | None = None, broker_url: str | None = None) -> ControllerProcess:
        """A replica with a home of its own (as on its own host): the same keys and config, its own sequence file and cache.

        ``counted_ahead_s``: its sequence counter starts that far ahead of the clock, as after a burst. ``prefix``: the
        command it runs under (``ip netns exec NAME``), with the store and broker at ``store_url`` and ``broker_url``
        (the addresses it reaches them at from there) instead of the home's."""
        home = EdgectlHome(self.home.path.parent / f"home-{name}", broker_url or self.home.broker_url)
        shutil.copytree(self.home.path / "keys", home.path / "keys")
        shutil.copy(self.home.path / "edgectl.yaml", home.path / "edgectl.yaml")
        if store_url is not None or broker_url is not None:  # the test's plaintext broker off loopback: insecure
            config = {"controller": {"store": store_url or self.url}, "insecure": broker_url is not None}
            (home.path / "edgectl.yaml").write_text(json.dumps(config))
        if counted_ahead_s:
            (home.path / "sequence").write_text(str(int((time.time() + counted_ahead_s) * 1000)))
        process = ControllerProcess(home, self.home.path.parent / f"controller-{name}.log", prefix=list(prefix)).start()
        self.controllers.append(process)
        return process

    def store(self) -> Store:
        if self._store is None:
            self._store = open_url(self.url, packages_dir=self.cache)
        return self._store

    def agents(self, count: int, **kw: Any) -> list[SimAgent]:
        root = self.home.path.parent / "sim"
        return [self.fleet.start(SimAgent(f"sim-{i:03d}", "cpu-x86", root / f"sim-{i:03d}", **kw)) for i in range(count)]

    def wait_devices(self, count: int) -> None:
        wait_for(lambda: sum(bool(d.online) for d in self.store().devices()) == count, 60, f"{count} devices online")

    def package(self, name: str, version: int, **model_kw: Any) -> Path:
        """A signed package for any target, built in process."""
        model = tiny_classifier(self.home.path / f"{name}-{version}.onnx", **model_kw)
        out = self.home.path / f"{name}-{version}.edgepkg"
        build_package(model, BuildOptions(name, version, TargetInfo("any"), golden_samples=0),
                      Keyring(self.home.path / "keys").signing_key("package"), out)
        return out

    def deploy(self, *args: str) -> str:
        result = self.home.edgectl("deploy", *args, "--json", check=True)
        return str(json.loads(result.stdout)["rollout_id"])

    def rollout(self, rollout_id: str) -> RolloutRow:
        found = self.store().rollout(rollout_id)
        assert found is not None, rollout_id
        return found

    def rows(self, rollout_id: str) -> list[RolloutDevice]:
        return self.store().rollout_devices(rollout_id)

    def audit(self, action: str) -> list[AuditEntry]:
        return [a for a in self.store().audit_log(limit=100000) if a.action == action]

    def leading(self, process: ControllerProcess) -> AuditEntry | None:
        """The store's record of ``process`` taking the engine lease."""
        assert process.process is not None
        return next((a for a in self.audit("controller leading") if a.detail == f"pid {process.process.pid}"), None)

    def publishers(self) -> dict[int, list[tuple[int, str]]]:
        """(broker time in whole seconds, topic) of each PUBLISH a controller process sent, by its pid, from the broker's log."""
        found: dict[int, list[tuple[int, str]]] = {}
        for m in PUBLISH.finditer(self.broker.log.read_text(errors="replace")):
            found.setdefault(int(m["pid"]), []).append((int(m["ts"]), m["topic"]))
        return found

    def close(self) -> None:
        for process in self.controllers:
            process.stop()
        self.fleet.stop()
        self.wire.close()
        if self._store is not None:
            self._store.close()


# Mosquitto 2: "Received PUBLISH from edgectl-controller-1234-ab12cd (d0, q1, r1, m3, 'edge/v1/...', ... (512 bytes))"
PUBLISH = re.compile(r"^(?P<ts>\d+): Received PUBLISH from edgectl-controller-(?P<pid>\d+)-\w+ \([^']*'(?P<topic>[^']+)'",
                     re.MULTILINE)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresCluster]:
    cluster = start_cluster()
    yield cluster
    cluster.stop()


@contextmanager
def open_replicas(tmp_path: Path, postgres: PostgresCluster, home_for: Any, also_listen: str = "") -> Iterator[Replicas]:
    """A home whose edgectl.yaml names a fresh PostgreSQL database, a logging Mosquitto, light agents, the wire.

    ``also_listen``: an address Mosquitto listens on besides 127.0.0.1 (the same port), for a replica elsewhere."""
    if also_listen:
        port = free_port()
        listeners = f"listener {port} 127.0.0.1\nlistener {port} {also_listen}\nallow_anonymous true\n"
        broker = start_mosquitto(tmp_path / "mosquitto", listeners + "log_type all\n", port)
    else:
        broker = start_mosquitto(tmp_path / "mosquitto", "log_type all\n")
    home: EdgectlHome = home_for(tmp_path, broker)
    url = postgres.create_database()
    (home.path / "edgectl.yaml").write_text(json.dumps({"controller": {"store": url}}))
    ring = Keyring(home.path / "keys")
    fleet = SimFleet(broker.url, TrustedKeys([ring.signing_key("package").public_key()]),
                     TrustedKeys([ring.signing_key("controller").public_key()]))
    plane = Replicas(home, broker, url, fleet, Wire(broker.url), tmp_path / "test-cache")
    try:
        yield plane
    finally:
        plane.close()
        broker.stop()


@pytest.fixture
def replicas(tmp_path: Path, postgres: PostgresCluster, home_for: Any) -> Iterator[Replicas]:
    """Two controllers' plane (:func:`open_replicas`) on the session's PostgreSQL cluster."""
    with open_replicas(tmp_path, postgres, home_for) as plane:
        yield plane


def seconds_since(start: float) -> float:
    return round(time.time() - start, 2)
