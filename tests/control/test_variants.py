"""A mixed fleet and per-target variants built by `edgectl build --target`, whose payloads are byte-identical."""

from __future__ import annotations

import json

from edgectl.examples import tiny_classifier
from tests.control.conftest import ControlPlane, active


def test_each_device_gets_its_own_variant_when_payloads_are_identical(plane: ControlPlane) -> None:
    plane.agents(2, profile="cpu-x86", prefix="x86")
    plane.agents(2, profile="jetson-orin", prefix="orin")
    plane.agents(1, profile="cpu-arm", prefix="pi")
    plane.start_controller()
    plane.wait_devices(5)
    model = tiny_classifier(plane.home.path / "det.onnx", size=8)
    packages = []
    for target in ("cpu-x86", "jetson-orin"):
        out = plane.home.path / f"det-{target}.edgepkg"
        plane.edgectl("build", str(model), "--target", target, "--name", "det", "--version", "1", "-o", str(out), check=True)
        packages.append(str(out))

    # One wave per device: light agents check golden data one at a time (see ControlPlane.package).
    args = [*packages, "--fleet", "all", "--waves", "1,2,3,100%", "--bake", "0s"]
    plan = json.loads(plane.edgectl("deploy", *args, "--dry-run", "--json", check=True).stdout)
    planned = {d["device_id"]: d["variant"] for w in plan["waves"] for d in w["devices"]}
    assert planned == {"orin-000": "det v1 (jetson-orin)", "orin-001": "det v1 (jetson-orin)",
                       "x86-000": "det v1 (cpu-x86)", "x86-001": "det v1 (cpu-x86)"}
    assert plan["skipped"] == [{"device_id": "pi-000", "target": "cpu-arm", "reason": "no package for target 'cpu-arm'"}]
    size = plan["waves"][0]["bytes"]
    # each payload counted once per wave
    assert all(w["bytes"] == size for w in plan["waves"]) and plan["total_bytes"] == 4 * size

    summary = plane.ended(plane.deploy(*args))
    assert summary["status"] == "done", summary
    rows = {d["device_id"]: (d["variant"], d["status"]) for d in summary["devices"]}
    assert rows == {**{k: (v, "ok") for k, v in planned.items()}, "pi-000": (None, "skipped")}
    assert summary["skipped"] == [{"device_id": "pi-000", "reason": "no package for target 'cpu-arm'"}]
    assert sorted(summary["packages"]) == ["det v1 (cpu-x86)", "det v1 (jetson-orin)"]
    agents = plane.fleet.agents
    assert len({active(agents[d]).artifact_id for d in planned}) == 1  # one artifact, two manifests
    assert agents["pi-000"].active is None
