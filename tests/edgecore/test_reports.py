"""Device reports on one typed path: built and published by the Reporter, read back by read_report, on the
in-memory transport; a body that names another device than its topic is refused for every kind."""

from __future__ import annotations

import json
import queue
from collections.abc import Callable

import pytest

from edgecore.errors import InternalError, ProtocolError
from edgecore.protocol import topics
from edgecore.protocol.logs import LogLine
from edgecore.protocol.reporter import Reporter, presence_will
from edgecore.protocol.reports import (
    Birth,
    ChunkRequest,
    DeploymentProgress,
    DeviceEvent,
    DeviceMetrics,
    DeviceState,
    IdentityMismatch,
    LatencyFigures,
    LogAnswer,
    ModelTelemetry,
    Presence,
    Report,
    RunningModel,
    StateDisk,
    Telemetry,
    read_report,
)
from edgecore.transport import Message
from edgecore.transport_memory import MemoryBroker, MemoryTransport

REPORTS: dict[str, Callable[[str], Report]] = {
    "birth": lambda d: Birth(d, 1.0, "0.10.0", "jetson-orin", {"site": "lobby"}, "http://cam:8080", {"cores": 8},
                             {"onnxruntime": "1.18"}),
    "presence": lambda d: Presence(d, True, 2.0),
    "state": lambda d: DeviceState(d, 3.0, RunningModel("det", 2, "a" * 64, "onnxruntime/CPUExecutionProvider", "b"),
                                   DeploymentProgress("d-1", "download", ""), 17),
    "telemetry": lambda d: Telemetry(
        d, 4.0, DeviceMetrics(12.5, 0.5, 4096, 1024, 25.0, 512, {"thermal_zone0:cpu": 41.5}, StateDisk("/var/lib", 10, 5, 50.0)),
        {"det": ModelTelemetry("2", "onnxruntime/CPUExecutionProvider", 10, 1, LatencyFigures(1.0, 2.0, 3.0), 5.0, 10, 0.02,
                               {"verdict": "all on the accelerator"}, {"slot": "b"})},
        {"backend": "onnxruntime/CPUExecutionProvider"}, {"VerificationError": 2}),
    "events": lambda d: DeviceEvent(d, "d-1", "download", "running", "", 5.0, {"model": "det"}),
    "chunk-requests": lambda d: ChunkRequest(d, "a" * 64, [[0, 3], [7, 9]], True),
    "logs": lambda d: LogAnswer(d, "logs-1", 6.0, (LogLine(5.5, "INFO", "agent", "up"),), False, 5.0),
}


def observer(broker: MemoryBroker) -> MemoryTransport:
    watcher = broker.transport("observer")
    watcher.subscribe(f"{topics.ROOT}/devices/+/+")
    watcher.connect()
    return watcher


def received(watcher: MemoryTransport) -> list[Message]:
    messages = []
    while True:
        try:
            messages.append(watcher.inbox.get_nowait())
        except queue.Empty:
            return messages


def test_every_report_the_reporter_publishes_reads_back_equal_with_its_qos_topic_and_retain() -> None:
    broker = MemoryBroker()
    watcher = observer(broker)
    device = broker.transport("cam-1", will=presence_will("cam-1"))
    device.connect()
    reporter = Reporter(device, "cam-1")
    sent = [make("cam-1") for make in REPORTS.values()]
    for report in sent:
        assert reporter.publish(report)
    messages = received(watcher)
    assert [m.topic for m in messages] == [topics.device("cam-1", leaf) for leaf in REPORTS]
    assert [read_report(m.topic, m.payload) for m in messages] == sent
    retained = {leaf for leaf in REPORTS if broker.retained(topics.device("cam-1", leaf)) is not None}
    assert retained == {"birth", "presence", "state"}
    device.abort()  # the last will: an offline presence, read on the same path
    will = read_report(*_topic_payload(received(watcher)[-1]))
    assert isinstance(will, Presence) and will.device_id == "cam-1" and not will.online


@pytest.mark.parametrize("leaf", list(REPORTS))
def test_a_body_that_names_another_device_is_refused_for_every_report_kind(leaf: str) -> None:
    broker = MemoryBroker()
    watcher = observer(broker)
    rogue = broker.transport("rogue")
    rogue.connect()
    rogue.publish(topics.device("cam-1", leaf), REPORTS[leaf]("cam-2").to_payload())
    rogue.publish(topics.device("cam-2", leaf), REPORTS[leaf]("cam-2").to_payload())  # positive control
    impostor, honest = received(watcher)
    with pytest.raises(IdentityMismatch, match=rf"^{leaf} on the topic of 'cam-1' names device 'cam-2'$"):
        read_report(impostor.topic, impostor.payload)
    assert read_report(honest.topic, honest.payload) == REPORTS[leaf]("cam-2")


def test_the_reporter_publishes_only_about_its_own_device() -> None:
    broker = MemoryBroker()
    device = broker.transport("cam-1")
    device.connect()
    with pytest.raises(InternalError, match="cam-2"):
        Reporter(device, "cam-1").publish(Presence("cam-2", True, 1.0))


@pytest.mark.parametrize("topic", [topics.device("cam-1", "desired"), topics.device("cam-1", "commands"),
                                   "edge/v1/devices/cam-1", "edge/v2/devices/cam-1/birth", "edge/v1/devices/../birth"])
def test_topics_that_carry_no_device_report_are_refused(topic: str) -> None:
    with pytest.raises(ProtocolError):
        read_report(topic, Presence("cam-1", True, 1.0).to_payload())


def test_reports_of_older_agents_read_with_defaults_and_unknown_keys_are_ignored() -> None:
    bare = {"schema": 1, "device_id": "cam-1", "from_the_future": [1, 2]}
    assert read_report(topics.device("cam-1", "birth"), json.dumps(bare).encode()) == Birth("cam-1")
    assert read_report(topics.device("cam-1", "state"), json.dumps(bare).encode()) == DeviceState("cam-1")
    models = {**bare, "models": {"det": {"version": "1"}}}
    assert read_report(topics.device("cam-1", "telemetry"), json.dumps(models).encode()) == Telemetry(
        "cam-1", models={"det": ModelTelemetry("1")})


@pytest.mark.parametrize("leaf, body, field", [
    ("birth", {"tags": {"site": 3}}, "birth.tags.site"),
    ("birth", {"target": ["cpu-x86"]}, "birth.target"),
    ("state", {"active": {"name": "det", "version": "2"}}, "state.active.version"),
    ("state", {"last_seq": -1}, "state.last_seq"),
    ("telemetry", {"device": {"cpu_percent": "busy"}}, "telemetry.device.cpu_percent"),
    ("telemetry", {"device": {"temperature_c": {"cpu": None}}}, "telemetry.device.temperature_c"),
    ("telemetry", {"rejected_messages": {"ProtocolError": 1.5}}, "telemetry.rejected_messages.ProtocolError"),
    ("telemetry", {"ts": float("inf")}, "telemetry.ts"),
])
def test_a_mistyped_field_is_refused_naming_it(leaf: str, body: dict[str, object], field: str) -> None:
    raw = json.dumps({"schema": 1, "device_id": "cam-1", **body}).encode()
    with pytest.raises(ProtocolError) as refused:
        read_report(topics.device("cam-1", leaf), raw)
    assert str(refused.value).startswith(field), refused.value


def _topic_payload(message: Message) -> tuple[str, bytes]:
    return message.topic, message.payload
