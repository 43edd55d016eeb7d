"""Telemetry: sliding-window statistics (clock seam), device metrics, Prometheus text, MQTT."""

from __future__ import annotations

import json
import queue
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from agent.telemetry import ModelStats, device_metrics
from edgecore.protocol.reports import ModelTelemetry, Telemetry
from tests.brokers import BrokerProcess


class Clock:
    """A manual clock passed into ModelStats."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_percentiles_counters_and_throughput() -> None:
    clock = Clock()
    stats = ModelStats(window_s=10.0, clock=clock)
    for ms in range(1, 101):
        clock.now += 0.05
        stats.record(ms / 1000.0)
    stats.record(0.5, ok=False)
    snap = stats.snapshot()
    assert snap["requests"] == 101 and snap["errors"] == 1 and snap["window_requests"] == 100
    assert snap["latency_ms"]["p50"] == pytest.approx(50.5)
    assert snap["latency_ms"]["p95"] == pytest.approx(95.05)
    assert snap["latency_ms"]["p99"] == pytest.approx(99.01)
    assert snap["throughput_rps"] == pytest.approx(20.0)  # 100 requests in the 5 s since it started


def test_window_slides_but_counters_do_not() -> None:
    clock = Clock()
    stats = ModelStats(window_s=5.0, clock=clock)
    stats.record(0.010)
    clock.now += 6.0
    stats.record(0.002)
    snap = stats.snapshot()
    assert snap["requests"] == 2 and snap["window_requests"] == 1
    assert snap["latency_ms"]["p99"] == pytest.approx(2.0)
    clock.now += 60.0
    assert ModelStats(clock=clock).snapshot()["latency_ms"] == {}
    assert stats.snapshot()["window_requests"] == 0


def test_device_metrics_read_thermal_from_the_root(tmp_path: Path) -> None:
    zone = tmp_path / "root/sys/class/thermal/thermal_zone3"
    zone.mkdir(parents=True)
    (zone / "type").write_text("soc-thermal\n")
    (zone / "temp").write_text("61250\n")
    metrics = device_metrics(tmp_path / "state/not-created-yet", hardware_root=tmp_path / "root")
    assert metrics.temperature_c == {"thermal_zone3:soc-thermal": 61.25}
    assert metrics.state_disk is not None and metrics.state_disk.total_bytes > 0
    assert metrics.process_rss_bytes is not None and metrics.process_rss_bytes > 0
    assert metrics.memory_used_bytes is not None and metrics.memory_total_bytes is not None
    assert 0 < metrics.memory_used_bytes <= metrics.memory_total_bytes
    json.dumps(metrics.to_json())


def test_telemetry_reaches_a_real_mqtt_subscriber(mosquitto: BrokerProcess, tmp_path: Path) -> None:
    """The telemetry report the daemon publishes survives a real broker and reads back with its types."""
    stats = ModelStats()
    stats.record(0.003)
    served = ModelTelemetry.from_json({"version": "1", **stats.snapshot()})
    payload = Telemetry("dev", 1.0, device_metrics(tmp_path), {"m": served})
    received: queue.Queue[bytes] = queue.Queue()
    subscriber = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="telemetry-sub")
    subscriber.on_message = lambda client, userdata, message: received.put(bytes(message.payload))
    subscriber.connect("127.0.0.1", mosquitto.port)
    subscriber.loop_start()
    publisher = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="telemetry-pub")
    try:
        subscribed = subscriber.subscribe("edge/v1/test/telemetry", qos=1)
        assert subscribed[0] == mqtt.MQTT_ERR_SUCCESS
        publisher.connect("127.0.0.1", mosquitto.port)
        publisher.loop_start()
        # Retained so that the subscription racing the publish cannot miss it.
        info = publisher.publish("edge/v1/test/telemetry", payload.to_payload(), qos=1, retain=True)
        info.wait_for_publish(timeout=10)
        got = Telemetry.from_payload(received.get(timeout=10))
    finally:
        publisher.loop_stop()
        subscriber.loop_stop()
    assert got.models["m"].requests == 1 and got.models["m"].latency_ms.p50 == 3.0
    assert got.device.state_disk is not None and got.device.state_disk.path == str(tmp_path)
