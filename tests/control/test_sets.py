"""Rollouts per model on the in-memory broker: each device's set composed from every rollout that reached it.

Light agents apply what they get as a set (schema 2): a model the set does not name is removed.
So a rollout that lost the other rollout's model from a device's set, or a rollback that put back
more than its own model, shows here as a device that no longer serves a model it should.
"""

from __future__ import annotations

from edgectl.controller import DeviceStatus
from edgectl.controller.queries import DeviceQuery
from tests.control.memory_plane import WAIT_S, MemoryPlane, served
from tests.fleet import wait_for

D = DeviceStatus


def test_two_rollouts_of_different_models_run_at_once_on_overlapping_devices(memory_plane: MemoryPlane) -> None:
    plane = memory_plane
    agents = {a.device_id: a for a in plane.agents("cam-1", "cam-2", "cam-3", tags={"site": "lobby"})}
    plane.agents("cam-4", tags={"site": "dock"})
    det, clf = plane.package("det", 1), plane.package("clf", 1, seed=1)
    # Both recorded before the controller sends either: every device of the lobby is in both rollouts.
    r_det = plane.deploy(det, "all", waves="1,100%")
    r_clf = plane.deploy(clf, "site=lobby", waves="2,100%")
    assert plane.ended(r_det).status.value == "done" and plane.ended(r_clf).status.value == "done"
    for device_id, agent in agents.items():
        wait_for(lambda a=agent: served(a) == {"det": 1, "clf": 1}, WAIT_S, f"{device_id} on det and clf")  # type: ignore[misc]
        desired = plane.retained_desired(device_id)
        assert desired["schema"] == 2 and sorted(m["name"] for m in desired["models"]) == ["clf", "det"]
        # Each entry names the rollout that put it there; the set is one sequence number.
        assert {m["name"]: m["deployment_id"] for m in desired["models"]} == {"det": r_det, "clf": r_clf}
    assert served(plane.fleet.agents["cam-4"]) == {"det": 1}
    assert {r.status for r in plane.rows(r_det).values()} == {D.OK}
    assert all(r.status == D.OK for r in plane.rows(r_clf).values())
    # The store lists what each device serves, one row a model: the console's filters.
    page = plane.store.device_page(DeviceQuery((("model", "clf"),)))
    assert sorted(r.id for r in page.rows) == ["cam-1", "cam-2", "cam-3"]


def test_a_halted_rollout_puts_back_only_its_own_model(memory_plane: MemoryPlane) -> None:
    plane = memory_plane
    agents = plane.agents("cam-1", "cam-2", latency_factor={"det@2": 3.0})
    det1, clf1 = plane.package("det", 1), plane.package("clf", 1, seed=1)
    assert plane.ended(plane.deploy(det1)).status.value == "done"
    assert plane.ended(plane.deploy(clf1)).status.value == "done"
    wait_for(lambda: all(served(a) == {"det": 1, "clf": 1} for a in agents), WAIT_S, "both models on both")
    # det v2 is three times slower: its latency gate halts it after the bake; clf v2 goes on at the same time.
    r_det = plane.deploy(plane.package("det", 2, seed=2), bake="1s", gates=["p95_latency <= 1.2x"])
    r_clf = plane.deploy(plane.package("clf", 2, seed=3), bake="1s")
    det, clf = plane.ended(r_det), plane.ended(r_clf)
    assert det.status.value == "rolled-back" and "p95_latency" in det.reason, det.reason
    assert clf.status.value == "done", clf.reason
    wait_for(lambda: all(served(a) == {"det": 1, "clf": 2} for a in agents), WAIT_S, "det back on v1, clf kept on v2")
    for agent in agents:
        desired = plane.retained_desired(agent.device_id)
        assert {m["name"]: m["version"] for m in desired["models"]} == {"det": 1, "clf": 2}
    assert all(r.status == D.ROLLED_BACK for r in plane.rows(r_det).values())


def test_a_newer_rollout_of_the_same_model_supersedes_only_that_model(memory_plane: MemoryPlane) -> None:
    plane = memory_plane
    plane.agents("cam-1")
    plane.fleet.stop("cam-1")  # offline: every rollout's desired state waits for it (deferred)
    wait_for(lambda: not (d := plane.store.device("cam-1")) or d.online is False, WAIT_S, "cam-1 offline")
    r_det1 = plane.deploy(plane.package("det", 1))
    r_clf = plane.deploy(plane.package("clf", 1, seed=1))
    wait_for(lambda: plane.rows(r_clf)["cam-1"].status == D.DEFERRED, WAIT_S, "clf deferred")
    r_det2 = plane.deploy(plane.package("det", 2, seed=2))
    wait_for(lambda: plane.rows(r_det2)["cam-1"].status == D.DEFERRED, WAIT_S, "det v2 deferred")
    assert plane.rows(r_det1)["cam-1"].status == D.SUPERSEDED
    assert plane.rows(r_clf)["cam-1"].status == D.DEFERRED  # another model's rollout is not superseded
    desired = plane.retained_desired("cam-1")
    assert {m["name"]: m["version"] for m in desired["models"]} == {"det": 2, "clf": 1}
