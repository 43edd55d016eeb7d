"""A decommissioned device gets nothing more and is never a fleet member again, whatever it sends.

Against a real Mosquitto and the controller service: its retained desired state is cleared, and when it
reconnects (a plaintext fleet, or a certificate the broker still takes) its reports are dropped and
counted, its record keeps its standing, no desired state acknowledges it, and `edgectl devices` leaves
it out though the broker still holds its retained birth. On the in-memory broker: a device decommissioned
in the middle of a rollout is cancelled there and no later rollout plans it; an abort rolls back the fleet
members only; its failure counts in no gate and is not retried; and a broker that lost its retained messages
gets no desired state back for it.
"""

from __future__ import annotations

import json
import queue
import time
from dataclasses import dataclass, field
from pathlib import Path

import paho.mqtt.client as mqtt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from paho.mqtt.enums import CallbackAPIVersion

from edgecore.protocol import topics
from edgecore.protocol.reports import Birth
from edgectl.controller.records import DeviceStatus, Phase, RolloutDevice, RolloutRow, RolloutSpec, RolloutStatus
from edgectl.controller.reports import Reports
from edgectl.controller.sets import SetMessage
from edgectl.controller.store import SqliteStore
from edgectl.fleet import request_action
from edgectl.fleet.direct import signed_desired
from edgectl.fleet.lifecycle import Revocation, decommission_device
from tests.control.conftest import ControlPlane
from tests.control.memory_plane import MemoryPlane
from tests.fleet import wait_for


def _retained(port: int, topic: str, settle_s: float = 0.5) -> bytes | None:
    """The message the broker retains on ``topic`` (None: none), read by a fresh subscriber."""
    got: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"peek-{time.monotonic_ns()}")
    client.on_message = lambda _c, _u, message: got.put(message)
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        client.subscribe(topic, qos=1)
        message = got.get(timeout=settle_s)
        return bytes(message.payload) if message.retain else None
    except queue.Empty:
        return None
    finally:
        client.loop_stop()
        client.disconnect()


def test_a_decommissioned_device_that_reconnects_stays_out_of_the_fleet(plane: ControlPlane) -> None:
    controller = plane.start_controller()
    port = plane.broker.port
    # The beacon follows the controller's subscriptions on its connection: a birth sent after it is a live one, which
    # the controller acknowledges (one it first reads retained, from before it subscribed, it does not).
    wait_for(lambda: _retained(port, topics.FLEET_BEACON) is not None, 30, "the controller's beacon")
    agents = plane.agents(2)
    kept, gone = (a.device_id for a in agents)
    desired = topics.device(gone, "desired")
    store = plane.store()
    wait_for(lambda: _retained(port, desired) is not None, 30, "the controller's acknowledgement retained for the device")

    done = decommission_device(store, gone, "user:test", None)
    assert done.certificate is Revocation.NO_PKI  # a plaintext fleet: nothing to revoke
    wait_for(lambda: store.unwithdrawn() == [], 30, "the controller to clear the retained desired state")
    assert _retained(port, desired) is None
    assert [(a.action, a.actor) for a in store.audit_log(device_id=gone)][-2:] == [
        ("device decommissioned", "user:test"), ("device withdrawn", "controller")]

    # The ingest reads the decommissioned devices every 2 s: once it dropped one report, it stores none of them.
    wait_for(lambda: controller.drops["decommissioned"] >= 1, 30, "the running device's telemetry dropped")
    before = store.device(gone)
    assert before is not None
    dropped = controller.drops["decommissioned"]
    plane.fleet.stop(gone)
    plane.restart_agent(agents[1])  # a live birth, presence, state and telemetry again
    wait_for(lambda: controller.drops["decommissioned"] >= dropped + 3, 30, "its reports dropped and counted")
    time.sleep(0.5)  # a tick or two: an acknowledgement would be retained by now
    after = store.device(gone)
    assert after is not None and after.decommissioned == before.decommissioned
    assert after.telemetry_ts == before.telemetry_ts and after.last_seen == before.last_seen
    assert _retained(port, desired) is None  # no desired state acknowledged it: it is not told this broker is the fleet's
    assert [d.id for d in store.devices()] == [kept]
    listed = json.loads(plane.edgectl("devices", "--json", check=True).stdout)  # the broker still retains its birth
    assert [d["device_id"] for d in listed] == [kept]
    member = store.device(kept)
    assert member is not None and (member.telemetry_ts or 0) > (before.telemetry_ts or 0)  # the fleet member's still count


def test_a_device_decommissioned_mid_rollout_is_cancelled_there_and_planned_nowhere(memory_plane: MemoryPlane) -> None:
    plane = memory_plane
    plane.agents("d-1", "d-2")
    plane.fleet.stop("d-2")
    wait_for(lambda: plane.store.device("d-2").online is False, 10, "d-2 offline")  # type: ignore[union-attr]
    package = plane.package("det", 1)
    rollout_id = plane.deploy(package)
    wait_for(lambda: plane.rows(rollout_id)["d-2"].status == DeviceStatus.DEFERRED, 10, "d-2 deferred")
    assert plane.broker.retained(topics.device("d-2", "desired"))  # waiting for it on the broker

    decommission_device(plane.store, "d-2", "user:test", None)
    assert plane.ended(rollout_id).status == RolloutStatus.DONE
    row = plane.rows(rollout_id)["d-2"]
    assert (row.status, row.detail) == (DeviceStatus.CANCELLED, "device decommissioned")
    assert plane.rows(rollout_id)["d-1"].status == DeviceStatus.OK
    wait_for(lambda: not plane.broker.retained(topics.device("d-2", "desired")), 10, "its desired state cleared")
    _, plan = plane.plan(plane.package("det", 2))
    assert [d.device_id for d in [*plan.devices, *plan.skipped, *plan.refused]] == ["d-1"]


def test_an_abort_rolls_back_the_fleet_members_and_sends_a_decommissioned_device_nothing(memory_plane: MemoryPlane) -> None:
    plane = memory_plane
    plane.agents("d-1", "d-2")
    rollout_id = plane.deploy(plane.package("det", 1), bake="1h")
    wait_for(lambda: all(r.status == DeviceStatus.OK for r in plane.rows(rollout_id).values()), 10, "both installed")
    decommission_device(plane.store, "d-2", "user:test", None)
    wait_for(lambda: plane.store.unwithdrawn() == [], 10, "its desired state cleared")
    request_action(plane.store, rollout_id, "abort", actor="user:test")
    assert plane.ended(rollout_id).status == RolloutStatus.ABORTED
    rows = plane.rows(rollout_id)
    assert rows["d-1"].status == DeviceStatus.ROLLED_BACK
    assert rows["d-2"].status == DeviceStatus.OK  # what it did stays; no rollback goes to it
    assert not plane.broker.retained(topics.device("d-2", "desired"))


@dataclass
class Sent:
    """A publisher that records what the engine would publish (the seam of edgectl.controller.reports.Publisher)."""

    messages: list[tuple[str, str]] = field(default_factory=list)

    def desired(self, device_id: str, message: SetMessage) -> bytes:
        raise AssertionError("nothing is signed here")

    def rollback(self, rollout: RolloutRow, device_id: str, message: SetMessage) -> tuple[bool, bytes]:
        raise AssertionError("nothing is rolled back here")

    def send(self, device_id: str, leaf: str, payload: bytes) -> bool:
        self.messages.append((device_id, leaf))
        return True

    def expect(self, rollout: RolloutRow, rows: list[RolloutDevice]) -> None:
        pass


def test_a_broker_that_lost_its_retained_messages_gets_no_desired_state_back_for_a_decommissioned_device(
        tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "controller.db")
    key = Ed25519PrivateKey.generate()
    spec = RolloutSpec("all", (), 1, 0.05, 0.0, (), 60.0)
    rows = []
    for device_id in ("d-1", "d-2"):  # sent, never taken (no state names its sequence number): republished on reconnect
        store.upsert_device(device_id, birth=Birth(device_id), birth_at=1.0)
        desired = signed_desired(key, device_id, "r-1", None)
        rows.append(RolloutDevice("r-1", device_id, 1, "", DeviceStatus.FAILED, desired=desired))
    store.create_rollout(RolloutRow("r-1", 1.0, RolloutStatus.DONE, spec, 1, Phase.BAKING), rows)
    store.decommission_device("d-2", 2.0)
    sent = Sent()
    assert Reports(store, sent).republish() == 1
    assert sent.messages == [("d-1", "desired")]


def test_a_decommissioned_devices_failure_counts_in_no_gate_and_is_not_retried(memory_plane: MemoryPlane) -> None:
    plane = memory_plane
    plane.agents("d-1", "d-2")
    rollout_id = plane.deploy(plane.package("det", 1), bake="1h")
    wait_for(lambda: all(r.status == DeviceStatus.OK for r in plane.rows(rollout_id).values()), 10, "both installed")
    decommission_device(plane.store, "d-2", "user:test", None)
    wait_for(lambda: plane.store.unwithdrawn() == [], 10, "its desired state cleared")
    row = plane.rows(rollout_id)["d-2"]
    row.status, row.detail = DeviceStatus.FAILED, "silent after install"  # as the silence gate marks a device gone quiet
    plane.store.save_rollout_device(row)
    request_action(plane.store, rollout_id, "retry-failed", actor="user:test")
    wait_for(lambda: ("retry-failed", "was running") in plane.audit(rollout_id), 10, "the retry applied")
    time.sleep(0.3)  # a few ticks: a failure rate of 1 in 2 would halt the wave by now
    assert plane.rollout(rollout_id).status == RolloutStatus.RUNNING
    assert plane.rows(rollout_id)["d-2"].status == DeviceStatus.FAILED
    assert not plane.broker.retained(topics.device("d-2", "desired"))
