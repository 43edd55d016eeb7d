"""Gates on a live simulated fleet: install failures and silence halt a rollout and roll back what took it."""

from __future__ import annotations

from tests.control.conftest import ControlPlane, audit_actions
from tests.deploy.models import nan_model
from tests.fleet import wait_for


def test_package_failing_health_halts_on_failure_rate_and_rolls_back_devices_that_took_it(plane: ControlPlane) -> None:
    plane.agents(3, profile="cpu-x86", prefix="c")
    plane.agents(3, profile="jetson-orin", prefix="o")
    plane.start_controller()
    plane.wait_devices(6)
    base = plane.deploy(str(plane.package("clf", 1, seed=1)), "--fleet", "all", "--waves", "100%", "--bake", "0s")
    assert plane.ended(base)["status"] == "done"
    wait_for(lambda: set(plane.versions().values()) == {1}, 10, "every device on v1")

    # The jetson variant answers NaN: its health check fails on every device that tries it.
    good, broken = plane.package("clf", 2, "cpu-x86", seed=2), plane.package("clf", 2, "jetson-orin", model=nan_model)
    rid = plane.deploy(str(good), str(broken), "--fleet", "all", "--waves", "4,100%", "--max-failure", "20%", "--bake", "30s")
    summary = plane.ended(rid)
    assert summary["status"] == "rolled-back", summary
    assert "failure_rate" in summary["reason"] and "wave 1" in summary["reason"], summary["reason"]
    rows = {d["device_id"]: d for d in summary["devices"]}
    assert rows["o-000"]["status"] == "failed" and "NaN" in rows["o-000"]["detail"]
    assert [rows[d]["status"] for d in ("c-000", "c-001", "c-002")] == ["rolled-back"] * 3  # they took v2: rolled back
    assert rows["o-001"]["status"] == rows["o-002"]["status"] == "cancelled"  # wave 2 never started
    wait_for(lambda: set(plane.versions().values()) == {1}, 10, "every device back on v1")
    assert audit_actions(summary).count("device rollback-sent") == 3 and "rollout halted" in audit_actions(summary)


def test_device_killed_right_after_install_trips_the_silence_gate(plane: ControlPlane) -> None:
    plane.configure({"deploy": {"timeout_s": 5}})  # how long a halt waits for rollbacks to be confirmed
    agents = plane.agents(3)
    plane.start_controller()
    plane.wait_devices(3)
    rid = plane.deploy(str(plane.package("clf", 1)), "--fleet", "all", "--waves", "100%", "--bake", "60s",
                       "--gate", "silence <= 3s")
    wait_for(lambda: plane.devices(rid)["sim-000"].status == "ok", 30, "sim-000 to commit")
    plane.fleet.kill("sim-000")  # no goodbye: no telemetry any more, presence still says online

    summary = plane.ended(rid)
    assert summary["status"] == "rolled-back" and "silence" in summary["reason"], summary
    rows = {d["device_id"]: d for d in summary["devices"]}
    assert rows["sim-001"]["status"] == rows["sim-002"]["status"] == "rolled-back"
    assert rows["sim-000"]["status"] == "rollback-sent"  # it could not confirm: it is gone
    ended = [a["detail"] for a in summary["audit"] if a["action"] == "rollout rolled-back"]
    assert "1 device(s) did not confirm: sim-000" in ended
    assert plane.versions() == {"sim-001": None, "sim-002": None}

    # Back with v1 still active: the controller sends the rollback again, once.
    back = plane.restart_agent(agents[0])
    wait_for(lambda: plane.devices(rid)["sim-000"].status == "rolled-back", 30, "sim-000 rolled back after it returned")
    assert back.active is None
    assert audit_actions(plane.rollout(rid), "sim-000").count("device rollback-sent") == 2
