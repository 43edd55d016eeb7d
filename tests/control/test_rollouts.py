"""Staged rollouts on a simulated fleet over a real Mosquitto, driven by the controller service."""

from __future__ import annotations

from tests.control.conftest import ControlPlane, active
from tests.fleet import wait_for


def test_good_package_reaches_20_agents_in_3_waves_then_slow_model_halts_and_rolls_back(plane: ControlPlane) -> None:
    plane.agents(20, latency_factor={"clf@2": 2.0})
    plane.start_controller()
    plane.wait_devices(20)
    v1 = plane.package("clf", 1, seed=1)
    rid = plane.deploy(str(v1), "--fleet", "all", "--waves", "2,50%,100%", "--bake", "1s")
    first = plane.ended(rid, timeout=90)
    assert first["status"] == "done", first
    assert sorted({d["wave"] for d in first["devices"]}) == [1, 2, 3]
    assert all(d["status"] == "ok" for d in first["devices"])
    wait_for(lambda: all(a.active and a.active.version == 1 for a in plane.fleet.agents.values()), 10, "all on v1")

    v2 = plane.package("clf", 2, seed=1, extra_matmuls=4)
    rid2 = plane.deploy(str(v2), "--fleet", "all", "--waves", "2,50%,100%", "--bake", "3s", "--gate", "p95_latency <= 1.2x")
    second = plane.ended(rid2, timeout=90)
    assert second["status"] == "rolled-back", second
    assert "p95_latency" in second["reason"] and "wave 1" in second["reason"]
    waves = {d["device_id"]: d for d in second["devices"]}
    assert sum(d["status"] == "rolled-back" for d in waves.values()) == 2
    assert all(d["status"] == "cancelled" for d in waves.values() if d["wave"] > 1)
    wait_for(lambda: all(active(a).version == 1 for a in plane.fleet.agents.values()), 10, "all back on v1")
    audit = [a["action"] for a in second["audit"]]
    assert "rollout halted" in audit and "device rollback-sent" in audit
