"""Bad input is refused with a one-line error and exit code 2; dry runs plan variants per target."""

from __future__ import annotations

import json

from tests.control.conftest import ControlPlane
from tests.fleet import wait_for


def test_bad_input_and_mixed_fleet_plan(plane: ControlPlane) -> None:
    plane.agents(2, profile="jetson-orin", prefix="orin", tags={"group": "lobby"})
    plane.agents(2, profile="nnapi", prefix="phone")
    plane.agents(1, profile="cpu-arm", prefix="pi")
    wait_for(lambda: len(json.loads(plane.edgectl("devices", "--json").stdout)) == 5, 20, "5 devices")
    orin, nnapi = plane.package("det", 3, "jetson-orin", seed=1), plane.package("det", 3, "nnapi", seed=2)

    bad = plane.edgectl("devices", "--selector", "gruop=lobby")
    assert bad.returncode == 2 and "unknown key 'gruop'" in bad.stderr
    lobby = json.loads(plane.edgectl("devices", "--selector", "group=lobby", "--json", check=True).stdout)
    assert sorted(d["device_id"] for d in lobby) == ["orin-000", "orin-001"]
    bad = plane.edgectl("deploy", str(orin), "--fleet", "all", "--gate", "p95_latency <= fast")
    assert bad.returncode == 2 and "expected METRIC OP NUMBER" in bad.stderr

    plan = json.loads(plane.edgectl("deploy", str(orin), str(nnapi), "--fleet", "all", "--waves", "1,100%", "--dry-run", "--json", check=True).stdout)
    variants = {d["device_id"]: d["variant"] for w in plan["waves"] for d in w["devices"]}
    assert variants["orin-000"] == "det v3 (jetson-orin)" and variants["phone-001"] == "det v3 (nnapi)"
    assert [s["device_id"] for s in plan["skipped"]] == ["pi-000"] and plan["total_bytes"] > 0
