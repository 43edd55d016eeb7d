"""``deploy --shadow``: canaries of the first wave run the new model beside the old one before cut-over."""

from __future__ import annotations

import json
from typing import Any

from edgectl.controller.records import FINAL
from tests.control.conftest import ControlPlane, active
from tests.fleet import wait_for


def _rollout(plane: ControlPlane, *args: str) -> dict[str, Any]:
    rid = json.loads(plane.edgectl("deploy", *args, "--json", check=True).stdout)["rollout_id"]
    ended: dict[str, Any] = wait_for(lambda: (r := plane.rollout(rid))["status"] in FINAL and r, 90, f"{rid} to end")
    return ended


def test_shadow_agreement_gate_stops_a_model_that_answers_differently_before_any_device_cuts_over(plane: ControlPlane) -> None:
    plane.agents(6, agreement={"clf@2": 0.9})
    plane.start_controller()
    first = _rollout(plane, str(plane.package("clf", 1, seed=1)), "--fleet", "all", "--waves", "100%", "--bake", "0s")
    assert first["status"] == "done", first

    shadow = ("--fleet", "all", "--waves", "2,100%", "--bake", "1s", "--shadow")
    halted = _rollout(plane, str(plane.package("clf", 2, seed=2)), *shadow)
    assert halted["status"] == "rolled-back" and "agreement" in halted["reason"], halted
    canaries = [d for d in halted["devices"] if d["wave"] == 1]
    assert len(canaries) == 2 and all(d["status"] == "failed" and "shadow" in d["detail"] for d in canaries), canaries
    assert all(d["status"] == "cancelled" for d in halted["devices"] if d["wave"] == 2)
    wait_for(lambda: all(a.active and a.active.version == 1 for a in plane.fleet.agents.values()), 10,
             "every device still on v1")

    passed = _rollout(plane, str(plane.package("clf", 3, seed=1)), *shadow)
    assert passed["status"] == "done", passed
    shadowed = {d["device_id"]: d["shadow"] for d in passed["devices"]}
    assert sorted(k for k, v in shadowed.items() if v) == sorted(d["device_id"] for d in passed["devices"] if d["wave"] == 1)
    wait_for(lambda: all(active(a).version == 3 for a in plane.fleet.agents.values()), 10, "every device on v3")
