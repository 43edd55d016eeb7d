"""Server-side device groups in the store (migration 8) and the selector fields groups query, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from edgecore.errors import NotFoundError, UserError
from edgecore.protocol.reports import DeviceState, RunningModel
from edgectl.controller.groups import DeviceGroup, GroupConflict, GroupInputError, GroupKind
from edgectl.controller.records import RolloutRow, RolloutSpec, RolloutStatus
from edgectl.controller.store import Store
from edgectl.fleet import create_group, delete_group, group_detail, group_list, remove_members, store_devices, update_group
from edgectl.fleet.groups import add_members
from tests.store.test_console import fleet, ids


def audited(store: Store) -> list[tuple[str, str]]:
    """The audit log's group entries: (action, actor)."""
    return [(a.action, a.actor) for a in store.audit_log() if a.action.startswith("group")]


def test_groups_are_kept_read_replaced_and_removed(store: Store) -> None:
    static = DeviceGroup("pilot", GroupKind.STATIC, ("cam-01", "gw-100"), "", "first wave", "ana", 10.0, 10.0)
    dynamic = DeviceGroup("lobby", GroupKind.DYNAMIC, (), "site=lobby", "", "bo", 11.0, 11.0)
    assert store.add_group(static) and store.add_group(dynamic)
    assert not store.add_group(DeviceGroup("pilot", GroupKind.DYNAMIC, query="all"))  # the name is taken: kept as it was
    assert store.groups() == [dynamic, static]
    assert store.group("pilot") == static and store.group("none") is None
    changed = DeviceGroup("pilot", GroupKind.STATIC, ("cam-03",), "", "second", "ana", 10.0, 12.0)
    assert store.save_group(changed) and store.group("pilot") == changed
    assert not store.save_group(DeviceGroup("none", GroupKind.STATIC))
    assert store.remove_group("pilot") and not store.remove_group("pilot")
    assert [g.name for g in store.groups()] == ["lobby"]


def test_version_and_site_select_in_the_store_and_in_python(store: Store) -> None:
    fleet(store)
    assert ids(store, ("version", "2")) == (["cam-01", "cam-03"], 2)  # some model it serves is at version 2
    assert ids(store, ("model", "det"), ("version", "1")) == (["cam-02"], 1)
    assert ids(store, ("site", "lobby")) == (["cam-01", "cam-02"], 2)
    assert [d["device_id"] for d in store_devices(store, "version=2")] == ["cam-01", "cam-03"]
    assert [d["device_id"] for d in store_devices(store, "site=lobby,agent=0.9")] == ["cam-01", "cam-02"]
    # A device serving several models is selected by the version of any of them, in SQL and in Python alike.
    models = (RunningModel("seg", 3), RunningModel("det", 1))
    store.upsert_device("gw-101", state=DeviceState("gw-101", active=models[0], models=models), state_at=2.0)
    assert ids(store, ("version", "1")) == (["cam-02", "gw-101"], 2)
    assert [d["device_id"] for d in store_devices(store, "version=1")] == ["cam-02", "gw-101"]


def test_static_and_dynamic_groups_resolve_against_the_devices(store: Store) -> None:
    fleet(store)
    create_group(store, "pilot", "static", ["cam-03", "gw-100", "cam-03"], actor="ana")
    create_group(store, "dets", "dynamic", query="model=det,version=2", description="det v2", actor="bo")
    assert store.group("pilot") is not None and store.group("pilot").members == ("cam-03", "gw-100")  # type: ignore[union-attr]
    assert [d["device_id"] for d in store_devices(store, "group:pilot")] == ["cam-03", "gw-100"]
    assert [d["device_id"] for d in store_devices(store, "group:dets")] == ["cam-01"]
    assert {g["name"]: g["resolved"] for g in group_list(store)} == {"dets": 1, "pilot": 2}
    with pytest.raises(UserError, match="selector: no device group 'nope'"):
        store_devices(store, "group:nope")
    with pytest.raises(UserError, match="is not a group name"):
        store_devices(store, "group:Bad Name")
    # A dynamic group is evaluated when used: a device that comes to match is in it.
    store.upsert_device("cam-02", state=DeviceState("cam-02", active=RunningModel("det", 2)), state_at=2.0)
    assert [d["device_id"] for d in store_devices(store, "group:dets")] == ["cam-01", "cam-02"]
    # A member the store no longer holds (a device deleted since) is listed as missing, not resolved.
    store.save_group(DeviceGroup("pilot", GroupKind.STATIC, ("cam-03", "gone-1")))
    detail = group_detail(store, "pilot")
    assert [d["device_id"] for d in detail["devices"]] == ["cam-03"] and detail["missing"] == ["gone-1"]
    assert audited(store) == [("group created", "ana"), ("group created", "bo")]


BAD = [  # name, kind, members, query, description: the field at fault
    (("Lobby", "static", [], "", ""), "name"),
    (("-lobby", "static", [], "", ""), "name"),
    (("a" * 64, "static", [], "", ""), "name"),
    (("lobby", "sometimes", [], "", ""), "kind"),
    (("lobby", "static", ["cam-01", "cam-99"], "", ""), "members[1]"),
    (("lobby", "static", [], "site=lobby", ""), "query"),
    (("lobby", "dynamic", ["cam-01"], "site=lobby", ""), "members"),
    (("lobby", "dynamic", [], "", ""), "query"),
    (("lobby", "dynamic", [], "site", ""), "query"),
    (("lobby", "dynamic", [], "colour=red", ""), "query"),
    (("lobby", "dynamic", [], "group:other", ""), "query"),
    (("lobby", "static", [], "", "x" * 501), "description"),
]


def test_bad_input_names_the_field_and_stores_nothing(store: Store) -> None:
    fleet(store)
    for (name, kind, members, query, description), field in BAD:
        with pytest.raises(GroupInputError) as caught:
            create_group(store, name, kind, members, query, description)
        assert caught.value.field == field and str(caught.value).startswith(f"{field}: "), (name, kind, field)
    assert store.groups() == [] and audited(store) == []


def test_changes_check_their_input_and_are_audited(store: Store) -> None:
    fleet(store)
    create_group(store, "pilot", "static", ["cam-01"], actor="ana")
    with pytest.raises(GroupConflict, match="exists") as taken:
        create_group(store, "pilot", "dynamic", query="all")
    assert taken.value.field == "name"
    assert add_members(store, "pilot", ["cam-02", "cam-01"], actor="bo").members == ("cam-01", "cam-02")
    with pytest.raises(GroupInputError, match=r"members\[0\]: no device 'cam-99'"):
        add_members(store, "pilot", ["cam-99"])
    with pytest.raises(GroupInputError, match="members\\[0\\]: 'cam-03' is not a member"):
        remove_members(store, "pilot", ["cam-03"])
    assert remove_members(store, "pilot", ["cam-01"], actor="cy").members == ("cam-02",)
    with pytest.raises(GroupInputError, match=r"^query:"):
        update_group(store, "pilot", query="site=lobby")
    create_group(store, "lobby", "dynamic", query="site=lobby")
    with pytest.raises(GroupInputError, match=r"^members: group 'lobby' is dynamic"):
        add_members(store, "lobby", ["cam-01"])
    with pytest.raises(GroupInputError, match=r"^query: unknown key 'colour'"):
        update_group(store, "lobby", query="colour=red")
    assert update_group(store, "lobby", query="site=Dock_A", actor="dee").query == "site=Dock_A"
    with pytest.raises(NotFoundError, match="no device group 'nope'"):
        update_group(store, "nope", description="x")
    assert store.group("pilot").members == ("cam-02",)  # type: ignore[union-attr]
    assert audited(store)[-4:] == [
        ("group changed", "bo"), ("group changed", "cy"), ("group created", "operator"), ("group changed", "dee")]


def test_a_group_a_running_rollout_was_planned_from_cannot_be_deleted(store: Store) -> None:
    fleet(store)
    create_group(store, "pilot", "static", ["cam-01"])
    rollout = RolloutRow("r-1", 1.0, RolloutStatus.RUNNING, RolloutSpec("group:pilot", (), 1, 0.05, 0.0, (), 60.0))
    store.create_rollout(rollout, [])
    with pytest.raises(GroupConflict, match="rollout\\(s\\) still running \\(r-1\\)"):
        delete_group(store, "pilot")
    assert store.group("pilot") is not None
    rollout.status = RolloutStatus.DONE
    store.save_rollout(rollout)
    delete_group(store, "pilot", actor="ana")
    assert store.group("pilot") is None and audited(store)[-1] == ("group deleted", "ana")
    with pytest.raises(NotFoundError):
        delete_group(store, "pilot")



def test_a_query_may_name_site_before_any_device_reports_one(store: Store) -> None:
    create_group(store, "far", "dynamic", query="site=far")
    detail = group_detail(store, "far")
    assert detail["devices"] == [] and detail["problem"] == ""
