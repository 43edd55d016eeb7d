"""A real 3-node NATS cluster with JetStream and an MQTT listener per node, started for one test.

NATS speaks MQTT 3.1.1 only (QoS 0 and 1; a QoS 2 subscription is downgraded), keeps MQTT
sessions and retained messages in JetStream streams that the cluster replicates, and needs a
``server_name`` per node. Each node gets its own client, route and MQTT port on 127.0.0.1 and its
own JetStream directory under the test's temp dir: nothing depends on a NATS already running.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tests.brokers import BrokerProcess, free_port

__all__ = ["NatsCluster", "NatsNode", "mqtt_ready", "nats_binary", "start_nats_cluster"]


def nats_binary() -> str | None:
    return shutil.which("nats-server") or next(
        (p for p in ("/usr/sbin/nats-server", "/usr/local/bin/nats-server") if Path(p).exists()), None
    )


@dataclass
class NatsNode:
    """One cluster member; ``broker.port`` is its MQTT port, so ``url`` is what MQTT clients use."""

    name: str
    client_port: int
    route_port: int
    monitor_port: int
    broker: BrokerProcess

    @property
    def url(self) -> str:
        return self.broker.url

    @property
    def mqtt_port(self) -> int:
        return self.broker.port

    def mqtt_clients(self) -> list[str]:
        """The MQTT client ids connected to this node (its monitoring endpoint's /connz)."""
        url = f"http://127.0.0.1:{self.monitor_port}/connz?limit=100000"
        with urllib.request.urlopen(url, timeout=5) as response:
            connz = json.load(response)
        return [c["mqtt_client"] for c in connz.get("connections") or [] if c.get("mqtt_client")]

    def alive(self) -> bool:
        return self.broker.process is not None and self.broker.process.poll() is None

    def kill(self) -> None:
        """SIGKILL, as a crashed machine: no goodbye to the cluster or the clients."""
        process = self.broker.process
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(10)
        self.broker.process = None


@dataclass
class NatsCluster:
    nodes: list[NatsNode] = field(default_factory=list)

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes]

    def node_of(self, client_prefix: str) -> NatsNode | None:
        """The live node an MQTT client whose id starts with ``client_prefix`` is connected to."""
        for node in self.nodes:
            if node.alive() and any(c.startswith(client_prefix) for c in node.mqtt_clients()):
                return node
        return None

    def stop(self) -> None:
        for node in self.nodes:
            node.broker.stop()


def _config(name: str, workdir: Path, client: int, route: int, mqtt: int, monitor: int, routes: list[int]) -> str:
    route_urls = ", ".join(f"nats-route://127.0.0.1:{p}" for p in routes)
    return f"""server_name: {name}
debug: {"true" if os.environ.get("NATS_DEBUG") else "false"}
listen: 127.0.0.1:{client}
http: 127.0.0.1:{monitor}
jetstream {{
  store_dir: "{workdir / 'jetstream'}"
  max_memory_store: 64MB
  max_file_store: 256MB
}}
cluster {{
  name: edge-test
  listen: 127.0.0.1:{route}
  routes: [{route_urls}]
}}
mqtt {{
  listen: 127.0.0.1:{mqtt}
  # Retained messages and sessions are replicated on every node: losing any one loses nothing.
  stream_replicas: 3
}}
"""


def start_nats_cluster(workdir: Path, size: int = 3, ready_timeout: float = 30.0) -> NatsCluster:
    """Start ``size`` nodes and wait until every node accepts an MQTT session (JetStream has a leader)."""
    binary = nats_binary()
    if binary is None:
        raise RuntimeError("nats-server is not installed: run ./scripts/test, or apt-get install nats-server")
    ports = [(free_port(), free_port(), free_port(), free_port()) for _ in range(size)]
    cluster = NatsCluster()
    for i, (client, route, mqtt, monitor) in enumerate(ports):
        name = f"n{i + 1}"
        node_dir = workdir / name
        node_dir.mkdir(parents=True, exist_ok=True)
        conf = node_dir / "nats.conf"
        conf.write_text(_config(name, node_dir, client, route, mqtt, monitor, [p[1] for p in ports]))
        broker = BrokerProcess([binary, "-c", str(conf)], mqtt, node_dir / "nats.log")
        cluster.nodes.append(NatsNode(name, client, route, monitor, broker))
    try:
        for node in cluster.nodes:
            node.broker.start()
        deadline = time.monotonic() + ready_timeout
        for node in cluster.nodes:
            while not mqtt_ready(node.mqtt_port):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"NATS node {node.name} accepts no MQTT session after {ready_timeout}s: "
                                       f"see {node.broker.log}")
                time.sleep(0.2)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def mqtt_ready(port: int) -> bool:
    """Whether an MQTT 3.1.1 CONNECT on 127.0.0.1:port gets CONNACK 'accepted' (NATS refuses until JetStream is up)."""
    client_id = f"probe-{port}".encode()
    variable = b"\x00\x04MQTT\x04\x02\x00\x0a"  # protocol 3.1.1, clean session, keepalive 10
    body = variable + len(client_id).to_bytes(2, "big") + client_id
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
            sock.settimeout(5)
            sock.sendall(bytes([0x10, len(body)]) + body)
            connack = sock.recv(4)
            sock.sendall(b"\xe0\x00")  # DISCONNECT
    except OSError:
        return False
    return len(connack) == 4 and connack[0] == 0x20 and connack[3] == 0
