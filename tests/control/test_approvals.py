"""When a rollout needs a second operator's approval, and which start times are taken (no broker: a store and a plan)."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgecore.errors import UserError
from edgectl.config import load_edgectl_config
from edgectl.controller.groups import GroupConflict
from edgectl.controller.planner import Plan, PlannedDevice
from edgectl.controller.records import RolloutStatus
from edgectl.controller.schedule import parse_start_at
from edgectl.controller.store import SqliteStore
from edgectl.controller.submit import RolloutOptions, submit_rollout
from edgectl.fleet import create_group, delete_group, update_group
from edgectl.fleet.approvals import approval_reason

NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z


def _plan(count: int) -> Plan:
    return Plan([PlannedDevice(f"d{i}", 1, None, None) for i in range(count)], {}, 0.0, waves=1)


def test_size_needs_approval_only_above_the_configured_count(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "store.db")
    assert approval_reason(store, "all", _plan(500), 0) == ""  # the default: off
    assert approval_reason(store, "all", _plan(10), 10) == ""
    assert approval_reason(store, "all", _plan(11), 10) == \
        "targets 11 devices, more than controller.approval.min_devices (10)"


def test_a_protected_group_needs_approval_whatever_its_size(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "store.db")
    store.upsert_device("d0", online=1, last_seen=NOW)
    create_group(store, "plant", "static", ["d0"], protected=True)
    create_group(store, "lab", "static", ["d0"])
    assert approval_reason(store, "group:plant", _plan(1), 0) == "targets protected group plant"
    assert approval_reason(store, "group:lab", _plan(1), 0) == ""
    update_group(store, "plant", protected=False)
    assert approval_reason(store, "group:plant", _plan(1), 0) == ""
    assert [g.protected for g in store.groups()] == [False, False]


def test_a_group_with_a_rollout_not_started_yet_is_kept(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "store.db")
    store.upsert_device("d0", online=1, last_seen=NOW)
    create_group(store, "plant", "static", ["d0"], protected=True)
    submit_rollout(store, _plan(1), RolloutOptions("group:plant", 0.05, 0.0, [], approval="targets protected group plant"))
    with pytest.raises(GroupConflict, match="group 'plant' is the selector of 1 rollout"):
        delete_group(store, "plant")
    assert [g.name for g in store.groups()] == ["plant"]


def test_the_approval_size_is_a_configuration_key(tmp_path: Path) -> None:
    config = tmp_path / "edgectl.yaml"
    config.write_text("controller: {}\n")
    assert load_edgectl_config(config).controller.approval.min_devices == 0  # the default: off
    config.write_text("controller:\n  approval:\n    min_devices: 25\n")
    assert load_edgectl_config(config).controller.approval.min_devices == 25


@pytest.mark.parametrize(("text", "says"), [
    ("tomorrow", "is not an ISO 8601 time"),
    ("2027-01-15T09:00:00", "has no UTC offset"),
    ("2027-01-15T08:00:00Z", "is in the past (the controller's clock reads 2027-01-15T08:00:00Z)"),
    ("2027-01-15T08:59:00+01:00", "is in the past"),
])
def test_bad_start_times_are_refused_naming_the_field(text: str, says: str) -> None:
    with pytest.raises(UserError, match=r"^start_at: .*" + says.replace("(", r"\(").replace(")", r"\)")):
        parse_start_at(text, NOW)


def test_a_start_time_with_any_offset_is_one_instant() -> None:
    assert parse_start_at("2027-01-15T09:01:00+01:00", NOW) == parse_start_at("2027-01-15T08:01:00Z", NOW) == NOW + 60


@pytest.mark.parametrize(("start_at", "approval", "status", "audited"), [
    (None, "", RolloutStatus.RUNNING, None),
    (NOW + 60, "", RolloutStatus.SCHEDULED, "rollout scheduled"),
    (None, "targets protected group plant", RolloutStatus.AWAITING_APPROVAL, "rollout awaiting approval"),
    (NOW + 60, "targets protected group plant", RolloutStatus.AWAITING_APPROVAL, "rollout awaiting approval"),
])
def test_the_first_status_of_a_recorded_rollout(tmp_path: Path, start_at: float | None, approval: str,
                                                 status: RolloutStatus, audited: str | None) -> None:
    store = SqliteStore(tmp_path / "store.db")
    options = RolloutOptions("all", 0.05, 0.0, [], start_at=start_at, approval=approval)
    rollout_id = submit_rollout(store, _plan(2), options, actor="api:alice")
    rollout = store.rollout(rollout_id)
    assert rollout is not None and rollout.status is status
    assert rollout.spec.created_by == "api:alice" and rollout.spec.start_at == start_at and rollout.spec.approval == approval
    actions = [(a.action, a.actor) for a in store.audit_log(rollout_id)]
    assert actions[0] == ("rollout created", "api:alice")
    assert actions[1:] == ([] if audited is None else [(audited, "api:alice")])
