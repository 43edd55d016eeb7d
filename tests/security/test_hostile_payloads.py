"""Hostile MQTT payloads on every topic the agent subscribes to and the controller consumes.

The agent: malformed, mistyped, oversized, deeply nested and non-UTF-8 payloads on its desired,
commands and artifact-chunk topics are logged once with the reason, counted in telemetry and
ignored; it keeps serving and still completes a real deployment afterwards. The controller: chunk
requests and device reports of the same kind raise only EdgeError or are dropped.
"""

from __future__ import annotations

import json
import os
import queue
from collections.abc import Callable
from pathlib import Path

import pytest

from edgecore.errors import EdgeError, ProtocolError
from edgecore.protocol import topics
from edgecore.protocol.chunks import read_chunk
from edgecore.protocol.envelope import COMMAND_TYPE, DESIRED_TYPE, sign
from edgecore.protocol.reports import ChunkRequest, read_report
from edgecore.transport import Message, MqttTransport
from edgectl.artifacts.chunk_server import ArtifactServer, ServedArtifact
from edgectl.controller.ingest import Ingest
from edgectl.controller.store import SqliteStore
from tests.brokers import BrokerProcess
from tests.fleet import AgentProcess, EdgectlHome, wait_for
from tests.security.crafted import Observer, controller_key, desired, make_package

DEVICE = "dev-h"
DEEP = b"[" * 100_000 + b"]" * 100_000
HUGE = b"{" + b" " * (5 * 1024 * 1024) + b"}"

# Bytes that are not a valid envelope at all (same for desired and commands).
RAW = [
    b"", b"{not json", b"\xff\xfe\x00\x80garbage", DEEP, HUGE, b'"a string"', b"[1, 2]", b"NaN",
    b'{"payloadType": 5, "payload": "", "signatures": []}',
    b'{"payload": "AAAA"}',
    b'{"payloadType": "x", "payload": "!!not base64", "signatures": []}',
    b'{"payloadType": "x", "payload": "", "signatures": "nope"}',
]


def _desired_fields(**change: object) -> bytes:
    base: dict[str, object] = {"schema": 1, "type": "desired", "device_id": DEVICE, "seq": 5, "issued_at": 1.0,
                               "expires_at": 4e9, "deployment_id": "d-1", "model": None, "options": {}}
    base.update(change)
    return json.dumps({k: v for k, v in base.items() if v is not ...}).encode()


# Inner payloads with a valid controller signature: only the schema stands between them and the agent.
SIGNED_DESIRED = [
    _desired_fields(seq="7"), _desired_fields(seq=True), _desired_fields(seq=-3), _desired_fields(device_id=...),
    _desired_fields(expires_at=float("nan")), _desired_fields(expires_at=10**400), _desired_fields(options=[1]),
    _desired_fields(device_id="../dev-h"), _desired_fields(model={"name": "m", "version": 1, "manifest": "x"}),
    _desired_fields(type="command"), _desired_fields(schema=99), DEEP, b"\xc3\x28\xa0\xa1",
]
SIGNED_COMMANDS = [
    json.dumps({"schema": 1, "type": "command", "device_id": DEVICE, "seq": 9, "issued_at": 1, "expires_at": 4e9,
                "command": "reboot"}).encode(),
    json.dumps({"schema": 1, "type": "command", "device_id": DEVICE, "seq": 9, "issued_at": 1, "expires_at": 4e9,
                "command": "report", "args": [1]}).encode(),
    json.dumps({"schema": 1, "type": "command", "device_id": DEVICE, "seq": False}).encode(),
]


def test_agent_survives_hostile_payloads_and_still_deploys(
    tmp_path: Path, mosquitto: BrokerProcess, edgectl_home: EdgectlHome, agents: Callable[..., AgentProcess]
) -> None:
    agent = agents(edgectl_home, DEVICE)
    observer = Observer.connect(mosquitto.port, DEVICE)
    key = controller_key(edgectl_home)
    observer.retained(topics.device(DEVICE, "birth"))  # the agent is connected and subscribed
    observer.settle(1)
    sent = 0
    for leaf in ("desired", "commands"):
        for raw in RAW:
            observer.publish(topics.device(DEVICE, leaf), raw)
            sent += 1
    for payload in SIGNED_DESIRED:
        observer.publish(topics.device(DEVICE, "desired"), sign(DESIRED_TYPE, payload, key).to_bytes())
        sent += 1
    for payload in SIGNED_COMMANDS:
        observer.publish(topics.device(DEVICE, "commands"), sign(COMMAND_TYPE, payload, key).to_bytes())
        sent += 1
    observer.wait_rejected(events=sent, counted=sent, timeout=60)
    assert agent.alive() and agent.ready()
    log = agent.log_text()
    assert "Traceback" not in log
    assert 0 < log.count("rejected message on") <= sent
    for event in observer.rejected_events():
        assert event["detail"] and event["detail"] in log  # every reason was logged (once)

    # Artifact chunks: garbage on the chunk topics of a real download in progress, then the real chunks.
    package = make_package(edgectl_home, tmp_path / "pkg", "m", 1, chunk_size=4096)
    artifact = package.manifest.artifact_id
    observer.client.subscribe(topics.device(DEVICE, "chunk-requests"), qos=1)
    observer.publish(topics.device(DEVICE, "desired"), desired(key, DEVICE, 10**12, package))
    def asked_for_chunks() -> bool:
        observer._drain()
        return any(t.endswith("/chunk-requests") for t, _, _ in observer.others)

    wait_for(asked_for_chunks, 30, "the agent to ask for chunks")
    size = package.manifest.payload.chunk_size
    chunk0 = read_chunk(package.payload, 0, size)
    bad_topics = ["abc", "1234567890", "-1"]
    for leaf in bad_topics:
        observer.publish(f"edge/v1/artifacts/{artifact}/chunks/{leaf}", chunk0)
    for leaf, data in [("0", os.urandom(size)), ("0", chunk0 + b"x"), ("1", b""), ("99999", chunk0), ("1", chunk0)]:
        observer.publish(f"edge/v1/artifacts/{artifact}/chunks/{leaf}", data)
    for index in range(len(package.manifest.payload.chunks)):
        observer.publish(topics.artifact_chunk(artifact, index), read_chunk(package.payload, index, size))
    wait_for(lambda: any(e["status"] == "ok" for e in observer.other_events()), 90, "the deployment to commit")
    assert agent.active_version() == 1 and agent.model_ready("m")
    observer.wait_rejected(events=sent, counted=sent + len(bad_topics))
    assert "dropped chunk 0" in agent.log_text()
    observer.close()


@pytest.fixture
def server(tmp_path: Path) -> ArtifactServer:
    payload = tmp_path / "payload"
    payload.write_bytes(os.urandom(10_000))
    transport = MqttTransport("mqtt://127.0.0.1:1", "hostile-test", inbox=queue.Queue())  # never connected
    server = ArtifactServer(transport)
    server.serve(ServedArtifact("a1", payload, 1024, 10))
    return server


CHUNK_REQUESTS = [
    *RAW,
    b'{"schema": 1, "device_id": "d", "artifact_id": "a1", "ranges": [[0, true]]}',
    b'{"schema": 1, "device_id": "d", "artifact_id": "a1", "ranges": [[5, 2]]}',
    b'{"schema": 1, "device_id": "d", "artifact_id": "a1", "ranges": [[-1, 2]]}',
    b'{"schema": 1, "device_id": "d", "artifact_id": "a1", "ranges": "0-9"}',
    b'{"schema": 1, "device_id": "d/x", "artifact_id": "a1", "ranges": [[0, 1]]}',
    b'{"schema": 1, "device_id": "d", "artifact_id": "a1", "ranges": [[0, 1]]' + b", [0, 1]" * 20000 + b"]}",
    b'{"schema": 1, "device_id": "d", "ranges": [[0, 1]]}',
]


@pytest.mark.parametrize("raw", CHUNK_REQUESTS)
def test_hostile_chunk_requests_never_reach_the_artifact_server(server: ArtifactServer, raw: bytes) -> None:
    with pytest.raises(EdgeError):
        read_report(topics.device("d", "chunk-requests"), raw)  # the only way a chunk request reaches the server
    huge = b'{"schema": 1, "device_id": "d", "artifact_id": "a1", "ranges": [[0, 1000000000000]]}'
    request = read_report(topics.device("d", "chunk-requests"), huge)
    assert isinstance(request, ChunkRequest)
    server.handle_request(request)
    assert server.requests == 1 and server._pending["a1"] == set(range(10))


REPORTS = [
    *RAW,
    b'{"schema": 1}',
    b'{"schema": 1, "device_id": 7}',
    b'{"schema": 2, "device_id": "a"}',
    b'{"schema": 1, "device_id": "a", "online": true, "ts": "now"}',
    b'{"schema": 1, "device_id": "a", "ts": NaN}',
    b'{"schema": 1, "device_id": "a", "ts": [1]}',
    b'{"schema": 1, "device_id": "a", "ts": 1e999}',
]


@pytest.mark.parametrize("leaf", ["presence", "birth", "state", "telemetry", "events", "chunk-requests", "logs"])
def test_the_report_reader_refuses_hostile_reports(leaf: str) -> None:
    for raw in REPORTS:
        with pytest.raises(EdgeError):
            read_report(topics.device("a", leaf), raw)


@pytest.mark.parametrize("leaf", ["presence", "birth", "state", "events", "telemetry"])
def test_controller_ingest_raises_only_edge_errors(tmp_path: Path, leaf: str) -> None:
    ingest = Ingest(SqliteStore(tmp_path / "store.db"))
    for raw in REPORTS:
        with pytest.raises(EdgeError):
            ingest.apply(Message(f"edge/v1/devices/a/{leaf}", raw, False), 1.0)
    for topic in ("edge/v1/devices/a/unknown", "edge/v1/devices/../birth", "edge/v2/x", "edge/v1/devices/a/b/c"):
        with pytest.raises(EdgeError):
            ingest.apply(Message(topic, b"{}", False), 1.0)


@pytest.mark.parametrize("models", [["m"], {"m": ["x"]}, {"m": {"version": 3}}, {"m": {"version": "1", "requests": -1}},
                                    {"m": {"version": "1", "latency_ms": {"p95": "fast"}}}])
def test_controller_ingest_refuses_mistyped_telemetry_naming_the_field(tmp_path: Path, models: object) -> None:
    store = SqliteStore(tmp_path / "store.db")
    raw = json.dumps({"schema": 1, "device_id": "a", "ts": 1.0, "models": models}).encode()
    with pytest.raises(ProtocolError, match=r"^telemetry\.models"):
        Ingest(store).apply(Message("edge/v1/devices/a/telemetry", raw, False), 1.0)
    assert store.device("a") is None and store.telemetry_history("a") == []  # nothing half-trusted
