"""The controller trusts the topic, not the body, ingests telemetry, and drops oversized payloads unparsed.

Fast cases drive the ingest and the inbox directly (a real SQLite store, no broker); live cases run
the controller service against a real Mosquitto with light agents and a rogue client.
"""

from __future__ import annotations

import json
import queue
import time
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from edgecore.protocol.reports import DeviceEvent
from edgecore.transport import Message
from edgectl.controller.inbox import Drops, Inbox, InboxLimits
from edgectl.controller.ingest import EventReport, Ingest
from edgectl.controller.records import DeviceStatus
from edgectl.controller.store import SqliteStore
from tests.control.conftest import ControlPlane
from tests.fleet import wait_for

DEV = "edge/v1/devices"


def _event(body_device: str, deployment: str = "r1", status: str = "failed") -> bytes:
    return DeviceEvent(body_device, deployment, "health", status, "spoofed", time.time()).to_payload()


def test_ingest_drops_a_body_that_names_another_device_and_counts_it(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "store.db")
    ingest = Ingest(store)
    reports: dict[str, dict[str, Any]] = {
        "state": {"active": None}, "telemetry": {"models": {}}, "presence": {"online": True, "ts": 1.0}}
    bodies = [("events", _event("dev-b"))]
    bodies += [(leaf, json.dumps({"schema": 1, "device_id": "dev-b", **body}).encode()) for leaf, body in reports.items()]
    for leaf, body in bodies:
        assert ingest.apply(Message(f"{DEV}/dev-a/{leaf}", body, False), 1.0) is None, leaf
    assert ingest.drops["identity"] == 4
    assert store.devices() == [] and store.events("dev-a") == [] and store.events("dev-b") == []

    report = ingest.apply(Message(f"{DEV}/dev-a/events", _event("dev-a"), False), 1.0)  # positive control
    assert isinstance(report, EventReport) and report.device_id == "dev-a"
    assert [e.device_id for e in store.events("dev-a")] == ["dev-a"] and ingest.drops["identity"] == 4


def test_inbox_drops_oversized_payloads_unparsed_and_keeps_a_flood_within_its_budget() -> None:
    drops = Drops()
    inbox = Inbox(InboxLimits(budget_bytes=10_000), drops)
    inbox.put(Message(f"{DEV}/a/telemetry", b"x" * (256 * 1024 + 1), False))  # not JSON: never parsed
    inbox.put(Message(f"{DEV}/a/presence", b"x" * 5000, False))
    assert inbox.qsize() == 0 and drops["oversized"] == 2
    for _ in range(100):
        inbox.put(Message(f"{DEV}/a/telemetry", b"t" * 1000, False))
    assert inbox.qsize() == 10 and inbox.waiting_bytes == 10_000 and drops["overflow"] == 90
    for _ in range(100):  # over budget, other reports still get in, up to twice the budget
        inbox.put(Message(f"{DEV}/a/events", b"e" * 1000, False))
    assert inbox.waiting_bytes == 20_000 and drops["overflow"] == 180
    while True:
        try:
            inbox.get_nowait()
        except queue.Empty:
            break
    assert inbox.waiting_bytes == 0
    inbox.put(Message(f"{DEV}/a/telemetry", b"t" * 1000, False))
    assert inbox.qsize() == 1


def _rogue(plane: ControlPlane) -> mqtt.Client:
    """Any local process on the plaintext loopback broker: it may publish on any device's topic."""
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="rogue", protocol=mqtt.MQTTv311)
    client.connect("127.0.0.1", plane.broker.port)
    client.loop_start()
    return client


def test_a_report_about_another_device_changes_nothing_and_is_counted(plane: ControlPlane) -> None:
    plane.agents(2)
    controller = plane.start_controller()
    plane.wait_devices(2)
    rid = plane.deploy(str(plane.package("clf", 1)), "--fleet", "all", "--waves", "100%", "--bake", "60s")
    wait_for(lambda: {d.status for d in plane.devices(rid).values()} == {DeviceStatus.OK}, 30, "both devices to commit")

    rogue = _rogue(plane)
    try:  # sim-001's topic, a body about sim-000: a failure report meant to halt the rollout
        rogue.publish(f"{DEV}/sim-001/events", _event("sim-000", rid), qos=1).wait_for_publish(5)
        wait_for(lambda: controller.drops["identity"] == 1, 10, "the impersonation to be dropped and counted")
    finally:
        rogue.loop_stop()
        rogue.disconnect()
    time.sleep(1.0)  # a tick or more: nothing may follow from it
    assert {d.status for d in plane.devices(rid).values()} == {DeviceStatus.OK}
    assert plane.row(rid).status == "running"
    assert [e for d in ("sim-000", "sim-001") for e in plane.store().events(d) if e.detail == "spoofed"] == []
    wait_for(lambda: any(a.action == "messages dropped" and "identity 1" in a.detail for a in plane.store().audit_log()),
             10, "the drop counter in the audit log")


def test_telemetry_reaches_the_store_and_the_latency_history(plane: ControlPlane) -> None:
    """Fails if the controller drops telemetry: rollouts would then judge latency from health checks alone."""
    plane.agents(1)
    plane.start_controller()
    plane.wait_devices(1)
    rid = plane.deploy(str(plane.package("clf", 1)), "--fleet", "all", "--waves", "100%", "--bake", "0s")
    assert plane.ended(rid)["status"] == "done"

    def telemetry_in_store() -> bool:
        device = plane.store().device("sim-000")
        return device is not None and device.telemetry is not None and "clf" in device.telemetry.models
    wait_for(telemetry_in_store, 15, "telemetry of the new model in the store")
    wait_for(lambda: any(p.source == "telemetry" for p in plane.store().latency("sim-000", "clf", 1)), 15,
             "a telemetry latency point")


def test_the_controller_drops_an_oversized_report_before_parsing(plane: ControlPlane) -> None:
    plane.agents(1)
    controller = plane.start_controller()
    plane.wait_devices(1)
    rogue = _rogue(plane)
    try:  # plain Mosquitto without the generated limits: the controller's own check must hold
        rogue.publish(f"{DEV}/sim-000/telemetry", b"{" + b" " * (5 * 1024 * 1024), qos=1).wait_for_publish(10)
        wait_for(lambda: controller.drops["oversized"] == 1, 10, "the oversized telemetry to be dropped")
    finally:
        rogue.loop_stop()
        rogue.disconnect()
    device = plane.store().device("sim-000")
    assert device is not None and device.telemetry is not None  # its own telemetry, still ingested
    assert device.telemetry.device_id == "sim-000"


def test_plaintext_loopback_warns_once_and_plaintext_elsewhere_needs_insecure(plane: ControlPlane) -> None:
    plane.agents(1)
    plane.wait_devices(1)
    listed = plane.edgectl("devices", "--json", check=True)
    warnings = [line for line in listed.stderr.splitlines() if "plaintext MQTT on loopback" in line]
    assert len(warnings) == 1 and len(listed.stderr.strip().splitlines()) == 1, listed.stderr
    refused = plane.edgectl("--broker", "mqtt://192.0.2.1:1883", "devices")
    assert refused.returncode == 2 and "is plaintext" in refused.stderr and "insecure: true" in refused.stderr, refused.stderr
