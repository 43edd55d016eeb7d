"""Records taken out, on SQLite and on PostgreSQL: a decommissioned device stays for history and leaves every fleet
question; deleting it removes its rows; an uploaded package's entry and file go; the audit log's filters and pages."""

from __future__ import annotations

import time
from pathlib import Path

from edgecore.protocol.reports import Birth, DeviceState, RunningModel, Telemetry
from edgectl.controller.history import TelemetryPoint
from edgectl.controller.queries import AuditQuery, DeviceQuery, UploadedPackage
from edgectl.controller.records import PackageRef
from edgectl.controller.store import Store
from tests.store.conftest import MakeStore


def _device(store: Store, device_id: str, target: str, model: str) -> None:
    store.upsert_device(device_id, birth=Birth(device_id, agent_version="0.9", target=target, tags={"site": "lab"}),
                        birth_at=1.0, state=DeviceState(device_id, active=RunningModel(model, 1)), state_at=1.0)
    store.upsert_device(device_id, online=1, presence_at=1.0)
    store.upsert_device(device_id, telemetry=Telemetry(device_id, 5.0), telemetry_ts=5.0, telemetry_at=5.0)
    store.add_telemetry(TelemetryPoint(device_id, 5.0, model, 1, 1.0, 2.0, 10.0, 20.0, 7, 1.0), claimed=5.0)
    store.add_latency(device_id, model, 1, 2.0, "telemetry", 5.0, claimed=5.0)
    store.add_event(device_id, 5.0, "r-1", "done", "ok", "", {})


def test_a_decommissioned_device_is_kept_but_leaves_every_fleet_question(store: Store) -> None:
    _device(store, "cam-1", "cpu-x86", "det")
    _device(store, "cam-2", "nnapi", "seg")
    assert store.decommission_device("cam-2", 100.0)
    assert not store.decommission_device("cam-2", 200.0)  # once: the first time stays
    assert not store.decommission_device("nope", 100.0)
    assert [d.id for d in store.devices()] == ["cam-1"]
    kept = store.device("cam-2")
    assert kept is not None and kept.decommissioned == 100.0 and kept.to_dict()["decommissioned"] == 100.0
    assert store.device_page(DeviceQuery()).total == 1
    assert [d.id for d in store.device_page(DeviceQuery(decommissioned=True)).rows] == ["cam-2"]
    assert store.device_page(DeviceQuery((("target", "nnapi"),))).total == 0
    assert store.device_counts() == {("cpu-x86", "online"): 1}
    assert store.device_models() == {("det", 1): 1}
    assert store.telemetry_summary()[0] == 1
    assert store.decommissioned_ids() == {"cam-2"}
    # A report stored after (before the ingest read the decommission) changes its data, never its standing.
    store.upsert_device("cam-2", online=1, last_seen=300.0, presence_at=300.0)
    assert store.devices()[0].id == "cam-1" and store.device("cam-2").decommissioned == 100.0  # type: ignore[union-attr]


def test_withdrawal_is_noted_once_per_decommissioned_device(store: Store) -> None:
    _device(store, "cam-1", "cpu-x86", "det")
    _device(store, "cam-2", "cpu-x86", "det")
    store.mark_withdrawn("cam-1", 5.0)  # a fleet member is never marked
    assert store.unwithdrawn() == []
    store.decommission_device("cam-1", 10.0)
    store.decommission_device("cam-2", 10.0)
    assert store.unwithdrawn() == ["cam-1", "cam-2"]
    store.mark_withdrawn("cam-1", 11.0)
    assert store.unwithdrawn() == ["cam-2"]


def test_deleting_removes_a_decommissioned_devices_rows_only(store: Store) -> None:
    _device(store, "cam-1", "cpu-x86", "det")
    _device(store, "cam-2", "cpu-x86", "det")
    assert not store.delete_device("cam-1")  # a fleet member: refused, nothing removed
    assert store.device("cam-1") is not None and store.telemetry_history("cam-1")
    store.decommission_device("cam-1", 10.0)
    assert store.delete_device("cam-1")
    assert store.device("cam-1") is None
    assert store.telemetry_history("cam-1") == [] and store.latency("cam-1") == [] and store.events("cam-1") == []
    assert store.device_models() == {("det", 1): 1}  # cam-2's row, nothing of cam-1's
    assert store.telemetry_history("cam-2") and store.events("cam-2")
    # The id stays taken out: a report under it (in the seconds before the ingest drops them) registers no device.
    assert store.decommissioned_ids() == {"cam-1"}
    store.upsert_device("cam-1", online=1, presence_at=20.0)
    assert store.device("cam-1") is None and [d.id for d in store.devices()] == ["cam-2"]
    assert [a.action for a in store.audit_log(device_id="cam-1")] == ["device registered"]  # its first, not a second


def test_discarding_a_package_removes_its_entry_and_kept_file(store: Store, tmp_path: Path) -> None:
    source = tmp_path / "p.edgepkg"
    source.write_bytes(b"package bytes")
    variant = "ab" * 32
    kept = store.keep_package(variant, source)
    store.save_package(UploadedPackage(PackageRef(variant, "c" * 64, "det", 1, "any", "det", str(kept), 13), 1.0, "user:a"))
    assert store.discard_package(variant)
    assert store.packages() == [] and not kept.exists()
    assert not store.discard_package(variant)


def test_the_audit_log_filters_by_actor_action_time_rollout_and_device_and_pages(make_store: MakeStore) -> None:
    store = make_store()
    for actor, action, rollout, device in [("user:alice", "device decommissioned", "", "cam-1"),
                                           ("user:bob", "package deleted", "", ""),
                                           ("controller", "wave started", "r-1", ""),
                                           ("user:al_ce", "abort", "r-1", "cam-2")]:
        store.audit(action, "d", rollout, device, actor)
        time.sleep(0.01)
    entries = store.audit_page(AuditQuery()).entries
    assert [e.action for e in entries] == ["device decommissioned", "package deleted", "wave started", "abort"]

    def actions(**kw: object) -> list[str]:
        return [e.action for e in store.audit_page(AuditQuery(**kw)).entries]  # type: ignore[arg-type]

    assert actions(actor="user:alice") == ["device decommissioned"]
    assert actions(actor="user:*") == ["device decommissioned", "package deleted", "abort"]
    assert actions(actor="user:al_*") == ["abort"]  # _ in a prefix is literal, not LIKE's one-character wildcard
    assert actions(action="device *") == ["device decommissioned"]
    assert actions(rollout_id="r-1") == ["wave started", "abort"]
    assert actions(device_id="cam-2", rollout_id="r-1") == ["abort"]
    assert actions(since=entries[1].ts, until=entries[3].ts) == ["package deleted", "wave started"]
    page = store.audit_page(AuditQuery(limit=2, offset=1))
    assert [e.action for e in page.entries] == ["package deleted", "wave started"] and page.total == 4
