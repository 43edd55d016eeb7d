"""A rollout survives its controller being killed (SIGKILL, restarted from the store) and its broker restarting."""

from __future__ import annotations

from tests.control.conftest import ControlPlane, audit_actions
from tests.fleet import wait_for


def test_controller_killed_mid_rollout_continues_from_its_store(plane: ControlPlane) -> None:
    # The store comes from the config key (relative to the config file), not $EDGECTL_HOME/controller.db.
    plane.configure({"controller": {"store": "rollouts/ctl.db"}})
    plane.store_path = plane.home.path / "rollouts" / "ctl.db"
    plane.agents(6)
    controller = plane.controller_process()
    plane.wait_devices(6)
    rid = plane.deploy(str(plane.package("clf", 1)), "--fleet", "all", "--waves", "2,4,100%", "--bake", "1s")
    wait_for(lambda: plane.row(rid).wave == 2 and plane.row(rid).phase == "installing", 60, "wave 2 to start")
    controller.kill()  # reports sent while it is down are lost: the devices' retained state tells the new process
    plane.controller_process()

    summary = plane.ended(rid)
    assert summary["status"] == "done", summary
    assert all(d["status"] == "ok" for d in summary["devices"]), summary["devices"]
    assert set(plane.versions().values()) == {1}
    assert audit_actions(summary).count("wave promoted") == 3
    assert not (plane.home.path / "controller.db").exists()
    started = [a for a in plane.store().audit_log() if a.action == "controller started"]
    assert len(started) == 2 and all(str(plane.store_path) in a.detail for a in started)


def test_broker_restart_mid_wave_and_the_rollout_continues(plane: ControlPlane) -> None:
    plane.agents(6)
    plane.start_controller()
    plane.wait_devices(6)
    rid = plane.deploy(str(plane.package("clf", 1)), "--fleet", "all", "--waves", "2,100%", "--bake", "1s")
    wait_for(lambda: plane.row(rid).wave == 2, 60, "wave 2 to start")
    plane.broker.restart(down_for=1.0)  # no persistence: retained births, states and desired states are gone

    summary = plane.ended(rid, timeout=90)
    assert summary["status"] == "done", summary
    assert all(d["status"] == "ok" for d in summary["devices"]), \
        [(d["device_id"], d["status"], d["state"], d["detail"]) for d in summary["devices"] if d["status"] != "ok"]
    wait_for(lambda: set(plane.versions().values()) == {1}, 10, "every device on v1")
