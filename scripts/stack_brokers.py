"""The stack's MQTT brokers, TLS with client certificates from the fleet PKI and per-identity topic ACLs.

- **NATS** (the clustered path of docs/fleet.md): three nodes, JetStream with MQTT streams replicated
  on all three, each node an MQTT listener over TLS that requires a certificate of the fleet CA and maps
  its subject to a user (``verify_and_map``). Each user's permissions are the ACL of ``edgectl broker
  config`` written as NATS subjects (``edge/v1/devices/+/desired`` is ``edge.v1.devices.*.desired``):
  the controller writes desired states, commands and chunks and reads every device topic; a device
  reads only its own desired state and commands (plus chunks) and writes only its own reports. NATS
  2.9 has no per-user templates (Mosquitto's ``%u``), so every enrolled device is a user of its own.
  An MQTT client's QoS 1 subscriptions are JetStream consumers delivered on ``$MQTT.sub.<id>``: every
  user may subscribe there (a device still cannot subscribe to another device's topics, nor to
  ``$MQTT/sub/#``: tested by hand on 2.9.10, the subscription is refused).
- **Mosquitto** (one site): ``edgectl broker config``'s own files, run as they are.

Both give the simulated devices (``edgectl sim``, which are no enrolled devices) one identity,
``sim-fleet``, allowed every device topic: a test tool's privilege, named as such in the ACL.
"""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import time
from dataclasses import dataclass
from pathlib import Path

from stack_state import Proc, free_port, spawn, wait_port

from edgecore.protocol.topics import DEVICE_PUBLISHES, DEVICE_SUBSCRIBES, FLEET_BEACON, ROOT
from edgectl.broker_config import ARTIFACT_CHUNKS

__all__ = ["SIM_IDENTITY", "BrokerFiles", "allow_simulator", "start_mosquitto", "start_nats", "tls_ready"]

SIM_IDENTITY = "sim-fleet"
CONTROLLER = "controller"


@dataclass(frozen=True)
class BrokerFiles:
    """``edgectl broker config``'s output: the CA, the broker's certificate and key, the Mosquitto config and ACL."""

    dir: Path

    @property
    def ca(self) -> Path:
        return self.dir / "ca.pem"

    @property
    def cert(self) -> Path:
        return self.dir / "broker.pem"

    @property
    def key(self) -> Path:
        return self.dir / "broker.key"


def _subject(topic: str) -> str:
    return topic.replace("/", ".").replace("+", "*").replace("#", ">")


def _device_permissions(device: str) -> tuple[list[str], list[str]]:
    publish = [_subject(f"{ROOT}/devices/{device}/{leaf}") for leaf in DEVICE_PUBLISHES]
    subscribe = [_subject(f"{ROOT}/devices/{device}/{leaf}") for leaf in DEVICE_SUBSCRIBES]
    return publish, [*subscribe, _subject(ARTIFACT_CHUNKS), _subject(FLEET_BEACON), "$MQTT.sub.>"]


def _users(devices: list[str]) -> str:
    controller_writes = [_subject(f"{ROOT}/devices/+/{leaf}") for leaf in DEVICE_SUBSCRIBES]
    controller = ([*controller_writes, _subject(ARTIFACT_CHUNKS), _subject(FLEET_BEACON)],
                  [_subject(f"{ROOT}/devices/#"), "$MQTT.sub.>"])
    users = {CONTROLLER: controller, SIM_IDENTITY: _device_permissions("*"),
             **{device: _device_permissions(device) for device in devices}}
    lines = []
    for name, (publish, subscribe) in users.items():
        lines.append(f'    {{ user: "CN={name}", permissions: {{ publish: {_list(publish)}, subscribe: {_list(subscribe)} }} }}')
    return "\n".join(lines)


def _list(items: list[str]) -> str:
    return "[" + ", ".join(f'"{i}"' for i in items) + "]"


def _nats_config(name: str, node_dir: Path, ports: tuple[int, int, int, int], routes: list[int], files: BrokerFiles,
                 devices: list[str]) -> str:
    client, route, mqtt, monitor = ports
    route_urls = ", ".join(f"nats-route://127.0.0.1:{p}" for p in routes)
    return f"""# Written by ./scripts/stack: one node of a 3-node NATS cluster serving MQTT over TLS (docs/fleet.md).
server_name: {name}
listen: 127.0.0.1:{client}
http: 127.0.0.1:{monitor}
jetstream {{
  store_dir: "{node_dir / 'jetstream'}"
  max_memory_store: 64MB
  max_file_store: 256MB
}}
cluster {{
  name: edgectl-stack
  listen: 127.0.0.1:{route}
  routes: [{route_urls}]
}}
mqtt {{
  listen: 127.0.0.1:{mqtt}
  stream_replicas: 3        # retained messages and sessions on every node: losing one loses none
  tls {{
    cert_file: "{files.cert}"
    key_file: "{files.key}"
    ca_file: "{files.ca}"
    verify_and_map: true    # a certificate of the fleet CA is required; its subject is the user
    timeout: 5
  }}
}}
authorization {{
  users = [
{_users(devices)}
  ]
}}
"""


def start_nats(root: Path, logs: Path, files: BrokerFiles, devices: list[str], client_tls: ssl.SSLContext,
               size: int = 3) -> list[Proc]:
    """Three clustered nodes; returns them once each accepts a TLS MQTT session (JetStream has its leaders)."""
    binary = shutil.which("nats-server") or "/usr/sbin/nats-server"
    if not Path(binary).exists():
        raise RuntimeError("nats-server is not installed: apt-get install nats-server (./scripts/test does as root)")
    ports = [(free_port(), free_port(), free_port(), free_port()) for _ in range(size)]
    procs = []
    for i, node_ports in enumerate(ports):
        name = f"nats-{i + 1}"
        node_dir = root / name
        node_dir.mkdir(parents=True, exist_ok=True)
        conf = node_dir / "nats.conf"
        conf.write_text(_nats_config(name, node_dir, node_ports, [p[1] for p in ports], files, devices))
        procs.append(spawn(name, [binary, "-c", str(conf)], logs, port=node_ports[2]))
    for proc in procs:
        wait_port(proc.port, 30, proc)
    deadline = time.monotonic() + 60
    for proc in procs:
        while not tls_ready(proc.port, client_tls):
            if time.monotonic() > deadline or not proc.alive():
                raise RuntimeError(f"{proc.name} accepts no MQTT session: see {proc.log}")
            time.sleep(0.3)
    return procs


def start_mosquitto(files: BrokerFiles, logs: Path, port: int, client_tls: ssl.SSLContext) -> Proc:
    """Mosquitto on ``edgectl broker config``'s files; as root it stays root (the stack's directory may be private)."""
    binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    if not Path(binary).exists():
        raise RuntimeError("mosquitto is not installed: apt-get install mosquitto")
    conf = files.dir / "mosquitto.conf"
    if os.geteuid() == 0:
        conf.write_text("user root\n" + conf.read_text())
    proc = spawn("mosquitto", [binary, "-c", str(conf)], logs, port=port)
    wait_port(port, 30, proc)
    deadline = time.monotonic() + 30
    while not tls_ready(port, client_tls):
        if time.monotonic() > deadline or not proc.alive():
            raise RuntimeError(f"mosquitto accepts no MQTT session: see {proc.log}")
        time.sleep(0.2)
    return proc


def allow_simulator(acl: Path) -> None:
    """Let the simulator's identity act for every device (Mosquitto's ACL; NATS's is in its users)."""
    acl.write_text(acl.read_text() + "\n# ./scripts/stack: the simulated devices share one identity, allowed every device "
                   f"topic.\nuser {SIM_IDENTITY}\n"
                   + "".join(f"topic read {ROOT}/devices/+/{leaf}\n" for leaf in DEVICE_SUBSCRIBES)
                   + f"topic read {ARTIFACT_CHUNKS}\ntopic read {FLEET_BEACON}\n"
                   + "".join(f"topic write {ROOT}/devices/+/{leaf}\n" for leaf in DEVICE_PUBLISHES))


def tls_ready(port: int, context: ssl.SSLContext) -> bool:
    """Whether an MQTT 3.1.1 CONNECT over TLS with ``context``'s certificate gets CONNACK 'accepted'."""
    client_id = f"stack-probe-{port}".encode()
    body = b"\x00\x04MQTT\x04\x02\x00\x0a" + len(client_id).to_bytes(2, "big") + client_id
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
                context.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
            sock.settimeout(5)
            sock.sendall(bytes([0x10, len(body)]) + body)
            connack = sock.recv(4)
            sock.sendall(b"\xe0\x00")
    except (OSError, ssl.SSLError):
        return False
    return len(connack) == 4 and connack[0] == 0x20 and connack[3] == 0
