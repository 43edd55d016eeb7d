"""Rollouts to server-side device groups: exactly the devices the group resolved to when planned, and no empty rollout."""

from __future__ import annotations

import pytest

from edgecore.errors import UserError
from edgectl.controller.groups import GroupConflict
from edgectl.controller.records import RolloutStatus
from edgectl.fleet import add_members, create_group, delete_group, request_action, update_group
from tests.control.memory_plane import MemoryPlane, served


def test_rollouts_to_a_dynamic_and_a_static_group_reach_exactly_their_devices(memory_plane: MemoryPlane) -> None:
    plane = memory_plane
    lobby = plane.agents("cam-1", "cam-2", tags={"site": "lobby"})
    dock = plane.agents("cam-3", "cam-4", tags={"site": "dock"})
    store = plane.store
    create_group(store, "lobby", "dynamic", query="site=lobby", actor="ana")
    create_group(store, "pilot", "static", ["cam-2", "cam-3"], actor="ana")

    first = plane.deploy(plane.package("det", 1), "group:lobby")
    assert plane.ended(first).status == RolloutStatus.DONE
    assert set(plane.rows(first)) == {"cam-1", "cam-2"} and plane.rollout(first).spec.selector == "group:lobby"
    assert [served(a) for a in lobby + dock] == [{"det": 1}, {"det": 1}, {}, {}]

    # Planned from the group as it is now; a member added after the rollout was recorded does not join it.
    second = plane.deploy(plane.package("seg", 1), "group:pilot", bake="1h")
    add_members(store, "pilot", ["cam-4"])
    with pytest.raises(GroupConflict, match="still running"):
        delete_group(store, "pilot")
    request_action(store, second, "abort")
    assert plane.ended(second).status in (RolloutStatus.ABORTED, RolloutStatus.ROLLED_BACK)
    assert set(plane.rows(second)) == {"cam-2", "cam-3"}
    delete_group(store, "pilot")
    assert store.group("pilot") is None


def test_a_group_that_resolves_to_no_device_or_does_not_exist_is_refused(memory_plane: MemoryPlane) -> None:
    plane = memory_plane
    plane.agents("cam-1", tags={"site": "lobby"})
    store = plane.store
    package = plane.package("det", 1)
    create_group(store, "empty", "static")
    create_group(store, "nowhere", "dynamic", query="site=nowhere")
    for selector in ("group:empty", "group:nowhere"):
        with pytest.raises(UserError, match=f"selector '{selector}' matches no device"):
            plane.plan(package, selector)
    with pytest.raises(UserError, match="selector: no device group 'nope'"):
        plane.plan(package, "group:nope")
    update_group(store, "nowhere", query="site=lobby")  # a dynamic group is evaluated when the rollout is planned
    assert [d.device_id for d in plane.plan(package, "group:nowhere")[1].devices] == ["cam-1"]
    assert store.rollouts() == []
