"""Bad input is refused with a one-line error (exit 2, or 3 for a signature); dry runs plan variants per target."""

from __future__ import annotations

import json
from pathlib import Path

from edgectl.examples import tiny_classifier
from edgectl.keys import Keyring
from edgectl.package import BuildOptions, build_package
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

    args = ("deploy", str(orin), str(nnapi), "--fleet", "all", "--waves", "1,100%", "--dry-run", "--json")
    plan = json.loads(plane.edgectl(*args, check=True).stdout)
    variants = {d["device_id"]: d["variant"] for w in plan["waves"] for d in w["devices"]}
    assert variants["orin-000"] == "det v3 (jetson-orin)" and variants["phone-001"] == "det v3 (nnapi)"
    assert [s["device_id"] for s in plan["skipped"]] == ["pi-000"] and plan["total_bytes"] > 0


def test_untrusted_key_downgrade_and_ambiguous_variants_are_refused(plane: ControlPlane, tmp_path: Path) -> None:
    plane.agents(2)
    plane.start_controller()
    plane.wait_devices(2)
    rid = plane.deploy(str(plane.package("clf", 2, seed=2)), "--fleet", "all", "--waves", "100%", "--bake", "0s")
    assert plane.ended(rid)["status"] == "done"
    wait_for(lambda: set(plane.versions().values()) == {2}, 10, "both on v2")

    bad = plane.edgectl("deploy", str(plane.package("clf", 3)), "--fleet", "gruop=lobby", "--dry-run")
    assert bad.returncode == 2 and "unknown key 'gruop'" in bad.stderr
    stranger = Keyring(tmp_path / "stranger")
    stranger.init("package")
    forged = tmp_path / "forged.edgepkg"
    build_package(tiny_classifier(tmp_path / "forged.onnx"), BuildOptions("clf", 9), stranger.signing_key("package"), forged)
    bad = plane.edgectl("deploy", str(forged), "--fleet", "all", "--dry-run")
    assert bad.returncode == 3 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    x86, x86_again = plane.package("clf", 3, "cpu-x86", seed=1), plane.package("clf", 4, "cpu-x86", seed=2)
    bad = plane.edgectl("deploy", str(x86), str(x86_again), "--fleet", "all", "--dry-run")
    assert bad.returncode == 2 and "two packages for target 'cpu-x86'" in bad.stderr
    bad = plane.edgectl("deploy", str(x86), str(plane.package("det", 3, "jetson-orin")), "--fleet", "all", "--dry-run")
    assert bad.returncode == 2 and "variants of one model: got 'clf', 'det'" in bad.stderr

    older = plane.package("clf", 1, seed=1)
    bad = plane.edgectl("deploy", str(older), "--fleet", "all")
    assert bad.returncode == 2 and "refusing a downgrade (sim-000 runs clf v2; sim-001 runs clf v2)" in bad.stderr
    assert "--allow-downgrade" in bad.stderr and len(plane.store().rollouts()) == 1
    rid = plane.deploy(str(older), "--fleet", "all", "--waves", "100%", "--bake", "0s", "--allow-downgrade")
    summary = plane.ended(rid)
    assert summary["status"] == "done", summary
    wait_for(lambda: set(plane.versions().values()) == {1}, 10, "both back on v1")
