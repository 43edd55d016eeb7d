"""Rollout plans: wave sizes at their roundings, which device gets which variant, and the packages a rollout refuses."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgecore.errors import UserError
from edgecore.protocol.envelope import MANIFEST_TYPE, sign
from edgecore.protocol.manifest import TargetInfo
from edgectl.controller.planner import check_variants, choose_variant, parse_waves, plan_rollout, variant_id
from edgectl.package import Package
from tests.guards.rollout_bench import signed_package

WAVES = [  # waves, devices, the size of each wave
    ("1,10%,50%,100%", 40, [1, 3, 16, 20]),
    ("1,10%,50%,100%", 3, [1, 1, 1]),  # 10% of 3 is 0.3 device: rounded up to 1, never 0
    ("25%,100%", 4, [1, 3]),
    ("26%,100%", 4, [2, 2]),  # 1.04 devices: rounded up
    ("50%", 5, [3, 2]),  # the last wave always reaches every device
    ("2,1", 5, [2, 3]),  # a count below the one before changes nothing
    ("3,100%", 2, [2]),  # a count above the fleet stops at the fleet
    ("1,1,1", 1, [1]),
    ("100%", 7, [7]),
    ("0.5%,100%", 100, [1, 99]),
    ("33.4%,100%", 3, [2, 1]),
    ("1,2,3", 10, [1, 1, 1, 7]),
]


def _devices(count: int, offline: tuple[int, ...] = ()) -> list[dict[str, Any]]:
    return [{"device_id": f"d{i:02d}", "target": "any", "status": "offline" if i in offline else "online"} for i in range(count)]


@pytest.mark.parametrize(("waves", "devices", "sizes"), WAVES, ids=[f"{w} of {n}" for w, n, _ in WAVES])
def test_waves_are_cumulative_sizes(tmp_path: Path, waves: str, devices: int, sizes: list[int]) -> None:
    plan = plan_rollout(_devices(devices), [signed_package(tmp_path)], waves, 0.0)
    assert [len(plan.wave_devices(w)) for w in range(1, plan.waves + 1)] == sizes and plan.waves == len(sizes)
    assert sorted(d.device_id for d in plan.devices) == [d["device_id"] for d in _devices(devices)]


def test_a_plan_is_unpaced_unless_asked(tmp_path: Path) -> None:
    plan = plan_rollout(_devices(3), [signed_package(tmp_path)], "100%", 0.0)
    assert plan.max_per_minute == 0 and plan.pacing_s(1) == 0.0
    assert plan_rollout(_devices(3), [signed_package(tmp_path)], "100%", 0.0, max_per_minute=2).pacing_s(1) == 60.0


def test_an_empty_fleet_has_no_wave(tmp_path: Path) -> None:
    plan = plan_rollout([], [signed_package(tmp_path)], "1,100%", 0.0)
    assert plan.waves == 0 and plan.devices == []


def test_online_devices_come_first_then_by_name(tmp_path: Path) -> None:
    plan = plan_rollout(_devices(5, offline=(0, 1)), [signed_package(tmp_path)], "1,2,100%", 0.0)
    assert [[d.device_id for d in plan.wave_devices(w)] for w in (1, 2, 3)] == [["d02"], ["d03"], ["d04", "d00", "d01"]]


@pytest.mark.parametrize(("text", "parts"), [("1,10%,50%,100%", ["1", "10%", "50%", "100%"]), (" 5 , 100% ,", ["5", "100%"]),
                                             ("0.5%", ["0.5%"]), ("100%", ["100%"]), ("2.5", ["2.5"])])
def test_waves_are_read(text: str, parts: list[str]) -> None:
    assert parse_waves(text) == parts


@pytest.mark.parametrize("text", ["", " , ", "0", "0%", "101%", "-1", "ten", "1.2.3", "5%%", "%", "1e2"])
def test_bad_waves_are_refused_naming_the_part(text: str) -> None:
    with pytest.raises(UserError, match="--waves: "):
        parse_waves(text)


# -- variants: one package per target ----------------------------------------------------------------------------


def _variant(folder: Path, target: str, classes: tuple[str, ...] = (), name: str = "clf", version: int = 2,
             chunk_size: int | None = None) -> Package:
    base = signed_package(folder, name, version)
    manifest = replace(base.manifest, target=TargetInfo(target, (), classes))
    if chunk_size is not None:
        manifest = replace(manifest, payload=replace(manifest.payload, chunk_size=chunk_size))
    return replace(base, manifest=manifest, envelope=sign(MANIFEST_TYPE, manifest.to_bytes(), Ed25519PrivateKey.generate()),
                   path=folder / f"{name}-{target}-{chunk_size}.edgepkg")


def test_a_device_gets_the_package_of_its_target_else_one_for_any(tmp_path: Path) -> None:
    orin, anything = _variant(tmp_path, "jetson-orin"), _variant(tmp_path, "any")
    nano = _variant(tmp_path, "jetson-nano", ("jetson",))
    assert choose_variant("jetson-orin", [anything, nano, orin]) is orin
    assert choose_variant("jetson", [anything, nano, orin]) is nano  # a device class the package lists
    assert choose_variant("cpu-x86", [nano, anything, orin]) is anything
    assert choose_variant(None, [orin, anything]) is anything
    assert choose_variant("cpu-x86", [orin, nano]) is None
    both = _variant(tmp_path, "jetson-nano", ("jetson-orin",))
    assert choose_variant("jetson-orin", [both, orin]) is orin  # its own target before a class it belongs to
    assert choose_variant("jetson-orin", [orin, both]) is orin


def test_a_device_with_no_package_is_skipped_with_the_reason(tmp_path: Path) -> None:
    devices = [{"device_id": "a", "target": "jetson-orin", "status": "online"},
               {"device_id": "b", "target": "nnapi", "status": "online"}]
    plan = plan_rollout(devices, [_variant(tmp_path, "jetson-orin")], "100%", 0.0)
    assert [d.device_id for d in plan.devices] == ["a"] and plan.devices[0].target == "jetson-orin"
    assert [(d.device_id, d.wave, d.variant, d.reason) for d in plan.skipped] == [("b", 0, None, "no package for target 'nnapi'")]


def test_the_variants_of_a_rollout_are_one_model_one_package_per_target(tmp_path: Path) -> None:
    orin = _variant(tmp_path, "jetson-orin")
    assert check_variants([orin, orin]) == {variant_id(orin): orin}  # the same package twice counts once
    with pytest.raises(UserError, match="variants of one model: got 'clf', 'det'"):
        check_variants([orin, _variant(tmp_path, "any", name="det")])
    with pytest.raises(UserError, match="two packages for target 'jetson-orin'"):
        check_variants([orin, _variant(tmp_path, "jetson-orin", ("x",))])
    with pytest.raises(UserError, match="same payload in different chunk sizes"):
        check_variants([orin, _variant(tmp_path, "any", chunk_size=2048)])
    assert len(check_variants([orin, _variant(tmp_path, "any")])) == 2
