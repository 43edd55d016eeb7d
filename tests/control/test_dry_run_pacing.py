"""The dry-run estimate of a paced rollout (``deploy --fleet ... --max-per-minute N --dry-run``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgecore.protocol.manifest import TargetInfo
from edgecore.protocol.reports import Birth
from edgectl.controller.planner import INSTALL_S, TRANSFER_BYTES_PER_S, Plan
from edgectl.controller.records import DeviceRecord
from edgectl.controller.store import SqliteStore
from edgectl.examples import tiny_classifier
from edgectl.fleet.rollouts import FleetRequest, plan_fleet_rollout, rollout_options
from edgectl.keys import Keyring
from edgectl.package import BuildOptions, build_package, read_package

DEVICES = [DeviceRecord(f"d{i:02d}", online=True, birth=Birth(f"d{i:02d}", target="cpu-x86")) for i in range(10)]


@pytest.fixture
def package_file(tmp_path: Path) -> Path:
    ring = Keyring(tmp_path / "keys")
    ring.init("package")
    out = tmp_path / "clf.edgepkg"
    model = tiny_classifier(tmp_path / "clf.onnx")
    build_package(model, BuildOptions("clf", 1, TargetInfo("any")), ring.signing_key("package"), out)
    return out


def plan(package_file: Path, max_per_minute: int) -> Plan:
    """What ``deploy --fleet all --waves 2,100% --bake 1m [--max-per-minute N] --dry-run`` plans."""
    request = FleetRequest([package_file], "all", waves="2,100%", bake="1m", max_per_minute=max_per_minute, dry_run=True)
    package = read_package(package_file, Keyring(package_file.parent / "keys").trusted("package"), package_file.parent)
    store = SqliteStore(package_file.parent / "controller.db")
    return plan_fleet_rollout(request, rollout_options(request, 600.0), [package], DEVICES, store)


def test_pacing_stretches_the_estimate_by_the_time_it_takes_to_send_each_wave(package_file: Path) -> None:
    unpaced, paced = plan(package_file, 0), plan(package_file, 4)
    size = unpaced.wave_bytes(1)
    transfer = size / TRANSFER_BYTES_PER_S
    assert unpaced.estimated_s() == pytest.approx(2 * (transfer + INSTALL_S + 60))
    # 2 then 8 devices at 4 a minute: the last one of each wave is sent 15 s and 105 s after the first.
    assert [paced.pacing_s(w) for w in (1, 2)] == [15.0, 105.0]
    assert paced.estimated_s() == pytest.approx(unpaced.estimated_s() + 15 + 105)
    data = paced.to_dict()
    assert data["max_per_minute"] == 4 and [w["pacing_s"] for w in data["waves"]] == [15.0, 105.0]
    assert data["estimated_s"] == round(paced.estimated_s(), 1)


def test_a_paced_wave_sends_the_payload_once_per_device(package_file: Path) -> None:
    """Its devices ask at different times: the broker fan-out no longer makes one transfer serve them all."""
    unpaced, paced = plan(package_file, 0), plan(package_file, 4)
    size = unpaced.wave_bytes(1)
    assert [unpaced.wave_bytes(w) for w in (1, 2)] == [size, size]
    assert [paced.wave_bytes(w) for w in (1, 2)] == [2 * size, 8 * size]
