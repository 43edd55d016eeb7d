"""A plan with a screen: a refused device is left out of every wave (wave 0, its reason kept), a flagged one planned
with its note. ./scripts/mutants runs this for edgectl/controller/planner.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgectl.controller.planner import PlannedDevice, plan_rollout, variant_id
from edgectl.package import Package
from tests.guards.rollout_bench import signed_package


def test_a_refused_device_is_in_no_wave_and_a_flagged_one_is_planned(tmp_path: Path) -> None:
    package = signed_package(tmp_path)
    devices = [{"device_id": f"d{i}", "target": "any", "status": "online"} for i in range(3)]

    def screen(device: dict[str, Any], _package: Package) -> tuple[str, str]:
        return {"d0": ("too big", ""), "d1": ("", "tight")}.get(device["device_id"], ("", ""))

    plan = plan_rollout(devices, [package], "100%", 0.0, screen=screen)
    assert plan.refused == [PlannedDevice("d0", 0, variant_id(package), "any", "too big")]
    assert [(d.device_id, d.wave, d.reason) for d in plan.devices] == [("d1", 1, "tight"), ("d2", 1, "")]
