"""One conformance suite for the Store protocol, run on SQLite and on PostgreSQL."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from edgecore.protocol.reports import (
    Birth,
    DeploymentProgress,
    DeviceState,
    LatencyFigures,
    ModelTelemetry,
    RunningModel,
    Telemetry,
)
from edgectl.controller.records import (
    DeviceEventRow,
    DeviceStatus,
    ModelRef,
    PackageRef,
    Phase,
    RolloutDevice,
    RolloutRow,
    RolloutSpec,
    RolloutStatus,
)
from edgectl.controller.store import Store
from tests.store.conftest import MakeStore


def spec(**kw: object) -> RolloutSpec:
    package = PackageRef("v" * 64, "a1", "tiny", 2, "any", "tiny@2", "/nowhere/v.edgepkg", 123)
    return RolloutSpec.from_dict({**spec_dict(package), **kw})


def spec_dict(package: PackageRef) -> dict[str, object]:
    return {"selector": "all", "packages": [package.to_dict()], "wave_count": 2, "max_failure": 0.1, "bake_s": 5.0,
            "gates": ["silence <= 60s"], "silence_s": 60.0}


def event(device: str, ts: float, status: str = "ok", deployment: str = "r-1") -> DeviceEventRow:
    return DeviceEventRow(device, ts, deployment, "done", status, "fine", {"backend": "cpu"})


def telemetry(device: str, n: int) -> Telemetry:
    return Telemetry(device, float(n), models={"tiny": ModelTelemetry("1", requests=n, latency_ms=LatencyFigures(p95=1.5))})


def test_devices_round_trip_and_ordered_upserts(store: Store) -> None:
    birth = Birth("d1", 10.0, "0.1.0", "cpu-x86", {"site": "lobby"}, "http://d1:8080", {"cores": 4}, {"onnxruntime": "1.18"})
    state = DeviceState("d1", 20.0, RunningModel("tiny", 2, "a1", "onnxruntime/CPUExecutionProvider", "a"),
                        DeploymentProgress("r-1", "download"), 5)
    store.upsert_device("d1", online=1, last_seen=10.0, birth=birth, birth_at=10.0)
    store.upsert_device("d1", state=state, state_at=20.0)
    store.upsert_device("d1", state=DeviceState("d1", last_seq=4), state_at=19.0)  # older, ingested later: ignored
    store.upsert_device("d1", telemetry=telemetry("d1", 2), telemetry_ts=100.0, telemetry_at=30.0)
    store.upsert_device("d1", telemetry=telemetry("d1", 1), telemetry_ts=101.0, telemetry_at=29.0)
    store.upsert_device("d1", online=0, presence_at=40.0)
    store.upsert_device("d1", online=1, presence_at=39.0)
    row = store.device("d1")
    assert row is not None
    assert (row.online, row.birth, row.state, row.telemetry, row.telemetry_ts) == (
        False, birth, state, telemetry("d1", 2), 100.0)
    store.upsert_device("d0", last_seen=1.0)
    assert [d.id for d in store.devices()] == ["d0", "d1"]
    assert store.device("nope") is None
    with pytest.raises(ValueError, match="unknown device field"):
        store.upsert_device("d1", colour="red")


def test_latency_filters_and_order(store: Store) -> None:
    for i in range(5):
        store.add_latency("d1", "tiny", 1 + i % 2, 10.0 + i, "telemetry", 100.0 + i)
    store.add_latency("d2", "tiny", 1, 99.0, "health", 100.0)
    assert [p.p95_ms for p in store.latency("d1")] == [10.0, 11.0, 12.0, 13.0, 14.0]
    assert [p.p95_ms for p in store.latency("d1", "tiny", 1)] == [10.0, 12.0, 14.0]
    assert [p.p95_ms for p in store.latency("d1", since=103.0)] == [13.0, 14.0]
    assert [p.p95_ms for p in store.latency("d1", limit=2)] == [13.0, 14.0]
    assert store.latency("d2")[0].source == "health"


def test_events_are_kept_once_and_claimed_once(make_store: MakeStore) -> None:
    one, other = make_store(), make_store()  # two controllers on one store
    for store in (one, other):
        store.add_event("d1", 5.0, "r-1", "done", "ok", "fine", {"backend": "cpu"})
    one.add_event("d1", 6.0, "r-1", "done", "failed", "boom", {})
    assert [e.status for e in one.events("d1")] == ["ok", "failed"]
    assert [e.ts for e in other.unclaimed_events()] == [5.0, 6.0]
    assert one.claim_event(event("d1", 5.0)) is True
    assert other.claim_event(event("d1", 5.0)) is False
    assert [e.ts for e in one.unclaimed_events()] == [6.0]
    assert one.events("d1")[0].data == {"backend": "cpu"}


def test_rollouts_round_trip(store: Store) -> None:
    rollout = RolloutRow("r-1", 1.0, RolloutStatus.RUNNING, spec(max_per_minute=30), wave=1, phase=Phase.START)
    rows = [RolloutDevice("r-1", "d2", 2, "v" * 64, DeviceStatus.PLANNED),
            RolloutDevice("r-1", "d1", 1, "v" * 64, DeviceStatus.PLANNED),
            RolloutDevice("r-1", "d9", 0, "", DeviceStatus.SKIPPED, detail="no variant")]
    store.create_rollout(rollout, rows)
    store.create_rollout(RolloutRow("r-2", 2.0, RolloutStatus.DONE, spec()),
                         [RolloutDevice("r-2", "d1", 1, "x", DeviceStatus.OK)])
    got = store.rollout("r-1")
    assert got is not None and got.spec == rollout.spec and got.phase == Phase.START
    assert [r.id for r in store.rollouts([RolloutStatus.RUNNING])] == ["r-1"]
    assert [r.id for r in store.rollouts()] == ["r-1", "r-2"]
    assert [r.device_id for r in store.rollout_devices("r-1")] == ["d9", "d1", "d2"]
    row = store.rollout_devices("r-1")[1]
    row.status, row.desired, row.previous, row.data = DeviceStatus.SENT, b"\x00signed\xff", ModelRef("tiny", 1, "a0"), {"k": 1}
    store.save_rollout_device(row)
    again = [r for r in store.device_rollouts("d1")]
    assert [r.rollout_id for r in again] == ["r-1", "r-2"]
    assert (again[0].status, again[0].desired, again[0].previous, again[0].data) == (
        DeviceStatus.SENT, b"\x00signed\xff", ModelRef("tiny", 1, "a0"), {"k": 1})
    got.status, got.wave = RolloutStatus.PAUSED, 2
    store.save_rollout(got)
    assert (store.rollout("r-1") or rollout).status == RolloutStatus.PAUSED
    assert store.rollout("r-3") is None


def test_batch_commits_together_or_not_at_all(store: Store) -> None:
    with pytest.raises(RuntimeError), store.batch():
        store.audit("one")
        with store.batch():  # joins the outer one
            store.audit("two")
        raise RuntimeError("boom")
    assert store.audit_log() == []
    with store.batch():
        store.audit("three")
    assert [a.action for a in store.audit_log()] == ["three"]


def test_audit_and_requests(store: Store) -> None:
    store.audit("rollout created", "x", "r-1", actor="operator")
    store.audit("device ok", "y", "r-1", "d1")
    store.audit("other", "z", "r-2", "d1")
    assert [a.action for a in store.audit_log("r-1")] == ["rollout created", "device ok"]
    assert [a.action for a in store.audit_log(device_id="d1")] == ["device ok", "other"]
    assert [a.action for a in store.audit_log(limit=1)] == ["other"]
    store.request("r-1", "pause")
    store.request("r-1", "resume")
    assert store.take_requests() == [("r-1", "pause"), ("r-1", "resume")]
    assert store.take_requests() == []


def test_kept_packages_are_readable_by_another_replica(make_store: MakeStore, tmp_path: Path) -> None:
    source = tmp_path / "p.edgepkg"
    source.write_bytes(b"package bytes" * 100)
    kept = make_store().keep_package("v1", source)
    assert kept.read_bytes() == source.read_bytes()
    other = make_store(cache="elsewhere")  # a replica on another machine: the recorded path is not there
    elsewhere = other.package_file("v1", tmp_path / "not-here.edgepkg") if other.location().startswith("postgresql") \
        else other.package_file("v1", kept)
    assert elsewhere.read_bytes() == source.read_bytes()


def test_location_names_no_password(store: Store) -> None:
    assert "password" not in store.location() and store.location()


def test_concurrent_writers_do_not_block_each_other(make_store: MakeStore) -> None:
    """Two replicas write the same devices in opposite orders inside their batches, at the same time."""
    stores = [make_store(), make_store()]
    ids = [f"d{i:02d}" for i in range(30)]
    errors: list[BaseException] = []

    def write(store: Store, order: list[str], start: threading.Barrier) -> None:
        try:
            start.wait(10)
            for n in range(5):
                with store.batch():
                    for device_id in order:
                        store.upsert_device(device_id, telemetry=telemetry(device_id, n), telemetry_ts=float(n),
                                            telemetry_at=float(n))
                        store.add_event(device_id, float(n), "r-1", "done", "ok", "", {})
        except BaseException as exc:  # reported below
            errors.append(exc)

    start = threading.Barrier(2)
    threads = [threading.Thread(target=write, args=(s, o, start)) for s, o in zip(stores, (ids, ids[::-1]), strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert all((stores[0].device(d) or stores[0].devices()[0]).telemetry == telemetry(d, 4) for d in ids)
    assert len(stores[1].unclaimed_events(limit=1000)) == 30 * 5
