"""Replicated controllers (issue 15.2): one engine leader on a PostgreSQL lease, a standby that takes over.

Two real `edgectl controller run` processes share one PostgreSQL store and one Mosquitto; light
agents (edgectl/sim.py) install for real over MQTT. What devices received is read off the wire (a
paho client subscribed to every device's desired state and commands), who published it off the
broker's log, and what the controllers recorded off the store.
"""

from __future__ import annotations

import collections
import time

from edgectl.controller.records import FINAL, DeviceStatus, RolloutStatus
from tests.control.conftest import ControllerProcess
from tests.fleet import wait_for
from tests.replicas.conftest import Replicas, Wire

TAKE_OVER_S = 10.0


def pid(process: ControllerProcess) -> int:
    assert process.process is not None
    return process.process.pid


def leader_and_standby(replicas: Replicas, counted_ahead_s: float = 0.0) -> tuple[ControllerProcess, ControllerProcess]:
    """Start one controller, let it lead, then a second one on the same store: it stands by."""
    leader = replicas.start_controller("a", counted_ahead_s)
    wait_for(lambda: replicas.leading(leader), 60, "the first controller to lead")
    standby = replicas.start_controller("b")
    wait_for(lambda: len(replicas.audit("controller started")) == 2, 60, "the second controller to start")
    return leader, standby


def duplicate_desired(wire: Wire) -> list[tuple[str, int]]:
    """(device, seq) of each desired state a device received more than once."""
    seen = collections.Counter((device, int(body["seq"])) for device, body in wire.received("desired"))
    return [key for key, n in seen.items() if n > 1]


def rollbacks(wire: Wire) -> collections.Counter[tuple[str, str]]:
    """Rollback commands per (device, rollout)."""
    return collections.Counter((device, str(body["args"].get("deployment_id")))
                               for device, body in wire.received("commands") if body["command"] == "rollback")


def lost_events(wire: Wire, replicas: Replicas) -> list[tuple[str, float, str, str, str]]:
    """Events devices published that the store does not hold."""
    published = {(d, round(float(e["ts"]), 6), e["deployment_id"], e["state"], e["status"]) for d, e in wire.received("events")}
    kept = {(e.device_id, round(e.ts, 6), e.deployment_id, e.state, e.status)
            for device in {key[0] for key in published} for e in replicas.store().events(device, limit=10000)}
    return sorted(published - kept)


def ended(replicas: Replicas, rollout_id: str, timeout: float) -> RolloutStatus:
    wait_for(lambda: replicas.rollout(rollout_id).status in FINAL, timeout, f"rollout {rollout_id} to end")
    return replicas.rollout(rollout_id).status


def test_the_standby_publishes_nothing_while_the_leader_lives(replicas: Replicas) -> None:
    replicas.agents(6)
    leader, standby = leader_and_standby(replicas)
    replicas.wait_devices(6)
    v1 = replicas.package("clf", 1, seed=1)
    done = replicas.deploy(str(v1), "--fleet", "all", "--waves", "2,100%", "--bake", "1s")
    assert ended(replicas, done, 120) is RolloutStatus.DONE
    # A gate no light agent meets (5 ms on cpu-x86): the canaries are rolled back, with commands.
    v2 = replicas.package("clf", 2, seed=2)
    halted = replicas.deploy(str(v2), "--fleet", "all", "--waves", "2,100%", "--bake", "5s", "--gate", "p95_latency <= 1ms")
    assert ended(replicas, halted, 120) is RolloutStatus.ROLLED_BACK

    assert standby.process is not None and standby.process.poll() is None, "the standby died"
    assert replicas.leading(standby) is None
    published = replicas.publishers()
    leaves = {topic.rsplit("/", 1)[-1] for _ts, topic in published.get(pid(leader), [])}
    assert {"desired", "commands"} <= leaves, leaves  # the broker's log does show a controller's publishes
    assert pid(standby) not in published, published[pid(standby)][:5]
    assert sum(rollbacks(replicas.wire).values()) == 2
    assert not duplicate_desired(replicas.wire)
    assert not lost_events(replicas.wire, replicas)


def test_sigkill_the_leader_mid_rollout_the_standby_finishes_it(replicas: Replicas) -> None:
    agents = replicas.agents(10)
    leader, standby = leader_and_standby(replicas)
    replicas.wait_devices(10)
    v1 = replicas.package("clf", 1, seed=1)
    # Waves of 2, 3 and 5 devices, one desired state every 2 s: wave 2 is being sent for about 4 s.
    rid = replicas.deploy(str(v1), "--fleet", "all", "--waves", "2,50%,100%", "--bake", "2s", "--max-per-minute", "30")

    def wave_2_half_sent() -> bool:
        rows = [r for r in replicas.rows(rid) if r.wave == 2]
        return replicas.rollout(rid).wave == 2 and any(r.status == DeviceStatus.PLANNED for r in rows) and \
            any(r.status != DeviceStatus.PLANNED for r in rows)

    wait_for(wave_2_half_sent, 120, "wave 2 to be half sent", interval=0.05)
    killed_at = time.time()
    leader.kill()

    took_over = wait_for(lambda: replicas.leading(standby), 30, "the standby to lead")
    first_action = wait_for(lambda: next((a for a in replicas.store().audit_log(rid) if a.ts > took_over.ts), None), 30,
                            "the new leader's first rollout action")
    print(f"take-over {took_over.ts - killed_at:.2f}s after the kill, first action ({first_action.action}) "
          f"{first_action.ts - killed_at:.2f}s")
    assert took_over.ts - killed_at < TAKE_OVER_S
    assert first_action.ts - killed_at < TAKE_OVER_S

    assert ended(replicas, rid, 180) is RolloutStatus.DONE
    rows = replicas.rows(rid)
    assert all(r.status == DeviceStatus.OK for r in rows), [(r.device_id, r.status, r.detail) for r in rows]
    wait_for(lambda: all(a.active and a.active.version == 1 for a in agents), 30, "every agent on v1")

    by_standby = replicas.publishers().get(pid(standby), [])
    assert by_standby, "the new leader published nothing"
    assert all(ts >= int(killed_at) for ts, _topic in by_standby), "the standby published before the kill"
    assert not duplicate_desired(replicas.wire)
    assert not rollbacks(replicas.wire)
    assert not lost_events(replicas.wire, replicas)
    assert not replicas.store().unclaimed_events(), "events no leader applied"


def test_sigkill_the_leader_as_it_rolls_back_no_device_is_rolled_back_twice(replicas: Replicas) -> None:
    agents = replicas.agents(6)
    # The leader's counter runs an hour ahead of the standby's clock: the standby's rollbacks must
    # still number above what the devices accepted from the leader, or they refuse them as stale.
    leader, standby = leader_and_standby(replicas, counted_ahead_s=3600)
    replicas.wait_devices(6)
    v1 = replicas.package("clf", 1, seed=1)
    rid = replicas.deploy(str(v1), "--fleet", "all", "--waves", "2,100%", "--bake", "5s", "--gate", "p95_latency <= 1ms")
    wait_for(lambda: replicas.rollout(rid).status is not RolloutStatus.RUNNING, 120, "the halt", interval=0.02)
    killed_at = time.time()
    leader.kill()

    took_over = wait_for(lambda: replicas.leading(standby), 30, "the standby to lead")
    assert took_over.ts - killed_at < TAKE_OVER_S
    sent = [a for a in replicas.audit("device rollback-sent") if a.ts < killed_at]
    print(f"killed with {len(sent)} rollback(s) sent; {[(r.device_id, r.status.value) for r in replicas.rows(rid)]}")
    assert ended(replicas, rid, 120) is RolloutStatus.ROLLED_BACK
    rows = {r.device_id: r for r in replicas.rows(rid)}
    assert sorted(r.status for r in rows.values() if r.wave == 1) == [DeviceStatus.ROLLED_BACK] * 2, rows
    wait_for(lambda: all(a.active is None for a in agents), 30, "every agent back on no model")
    assert rollbacks(replicas.wire) == {(device, rid): 1 for device, row in rows.items() if row.wave == 1}
    assert not duplicate_desired(replicas.wire)
    assert not lost_events(replicas.wire, replicas)
    assert not replicas.store().unclaimed_events(), "events no leader applied"
