"""Ingest on the controller's clock (issue 27.6): a device's claimed time is data, never an order.

Issue 27 found: a device that reported once with its clock 10 years ahead kept that stale report in
the store until 2036, whatever it reported next with the right time. Here a real Mosquitto and the
controller's service loop (SQLite store): the device publishes a state and a telemetry report
claiming a time 10 years ahead, then newer ones at the right time. The newer reports win in the
store (ordered by when the controller received them), and the skew is flagged: log, audit log
(``device clock off``), the health's ``devices_clock_off`` while it lasts.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from edgecore.protocol import topics
from edgecore.protocol.reports import DeviceState, RunningModel
from edgecore.protocol.telemetry import Telemetry
from edgectl.controller.records import DeviceRecord
from tests.brokers import BrokerProcess
from tests.control.conftest import ControlPlane
from tests.fleet import wait_for

DEVICE = "clock-dev"
TEN_YEARS_S = 10 * 365.25 * 86400


@pytest.fixture
def device(mosquitto: BrokerProcess) -> Iterator[mqtt.Client]:
    """A paho client publishing as the device (the test broker has no ACL)."""
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"{DEVICE}-{uuid.uuid4().hex[:4]}", protocol=mqtt.MQTTv5)
    host, port = mosquitto.url.removeprefix("mqtt://").rsplit(":", 1)
    client.connect(host, int(port))
    client.loop_start()
    yield client
    client.disconnect()
    client.loop_stop()


def _state(version: int, ts: float) -> bytes:
    return DeviceState.of_set(DEVICE, ts, (RunningModel("clf", version),), None, version, None).to_payload()


def _publish(client: mqtt.Client, leaf: str, payload: bytes, retain: bool) -> None:
    client.publish(topics.device(DEVICE, leaf), payload, qos=1, retain=retain).wait_for_publish(10)


def _device(plane: ControlPlane) -> DeviceRecord | None:
    return plane.store().device(DEVICE)


def test_a_device_10_years_ahead_then_right_keeps_its_newer_reports_and_is_flagged(plane: ControlPlane,
                                                                                   device: mqtt.Client) -> None:
    controller = plane.start_controller()
    ahead = time.time() + TEN_YEARS_S
    _publish(device, "state", _state(1, ahead), retain=True)  # retained: it reaches the controller once it subscribes
    flagged = wait_for(lambda: [a for a in plane.store().audit_log(device_id=DEVICE) if a.action == "device clock off"], 15,
                       "the skew to be flagged in the audit log")
    assert len(flagged) == 1, flagged  # once per device while it lasts, not once per report
    assert "ahead of the controller's clock" in flagged[0].detail and f"{TEN_YEARS_S:.0f}"[:4] in flagged[0].detail
    assert controller.health.snapshot()["ingest"]["devices_clock_off"] == 1
    _publish(device, "telemetry", Telemetry(DEVICE, ahead).to_payload(), retain=False)  # the controller listens by now
    first = wait_for(lambda: (d := _device(plane)) is not None and d.telemetry is not None and d, 15, "the first reports")
    assert first.active is not None and first.active.version == 1

    right = time.time()
    _publish(device, "state", _state(2, right), retain=True)
    _publish(device, "telemetry", Telemetry(DEVICE, right).to_payload(), retain=False)

    def newer() -> DeviceRecord | None:
        d = _device(plane)
        ok = d is not None and d.active is not None and d.active.version == 2 and d.telemetry is not None \
            and d.telemetry.ts == right
        return d if ok else None

    kept = wait_for(newer, 15, "the right-time reports to replace the ones 10 years ahead")
    assert kept.state is not None and kept.state.ts == right  # the claimed time is kept, as data
    assert kept.last_seen is not None and abs(kept.last_seen - right) < 60  # received now, not in ten years
    assert controller.health.snapshot()["ingest"]["devices_clock_off"] == 0  # its clock is right again
    assert len([a for a in plane.store().audit_log(device_id=DEVICE) if a.action == "device clock off"]) == 1
