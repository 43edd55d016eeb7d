"""What the controller refuses to send, on the in-memory broker: a set to an agent that does not speak schema 2,
and a set that does not fit a device's memory budget (predicted when the rollout is planned, and again when sent)."""

from __future__ import annotations

from edgectl.controller import DeviceStatus
from edgectl.sim_sets import MIB
from tests.control.memory_plane import WAIT_S, MemoryPlane, served
from tests.fleet import wait_for

D = DeviceStatus


def test_an_agent_from_before_sets_takes_one_model_in_schema_1_and_is_refused_a_second(memory_plane: MemoryPlane) -> None:
    plane = memory_plane
    old, new = plane.agents("old-1", schemas=(1,))[0], plane.agents("new-1")[0]
    det, clf = plane.package("det", 1), plane.package("clf", 1, seed=1)
    r_det = plane.deploy(det)
    assert plane.ended(r_det).status.value == "done"
    assert plane.retained_desired("old-1")["schema"] == 1 and plane.retained_desired("old-1")["model"]["name"] == "det"
    assert plane.retained_desired("new-1")["schema"] == 2
    # Planned now, old-1 would hold det and clf: refused in the plan, recorded, audited; nothing sent to it.
    _request, plan = plane.plan(clf)
    assert [d.device_id for d in plan.refused] == ["old-1"] and [d.device_id for d in plan.devices] == ["new-1"]
    reason = plan.refused[0].reason
    assert "schema 1 only" in reason and "clf v1, det v1" in reason, reason
    r_clf = plane.deploy(clf)
    assert plane.ended(r_clf).status.value == "done"
    row = plane.rows(r_clf)["old-1"]
    assert row.status == D.REFUSED and row.detail == reason and row.desired is None
    assert ("device refused", reason) in plane.audit(r_clf, "old-1")
    wait_for(lambda: served(new) == {"det": 1, "clf": 1}, WAIT_S, "new-1 on det and clf")
    assert served(old) == {"det": 1} and plane.retained_desired("old-1")["model"]["name"] == "det"


def test_a_refusal_when_sent_names_the_rollout_in_flight_that_made_the_set(memory_plane: MemoryPlane) -> None:
    """Both rollouts recorded while the old agent ran nothing: the second one sent finds the first one's model."""
    plane = memory_plane
    old = plane.agents("old-1", schemas=(1,))[0]
    plane.controller.stop()  # nothing is sent until both are recorded
    plane.thread.join(10)
    r_det, r_clf = plane.deploy(plane.package("det", 1)), plane.deploy(plane.package("clf", 1, seed=1))
    assert plane.rows(r_det)["old-1"].status != D.REFUSED and plane.rows(r_clf)["old-1"].status != D.REFUSED
    plane.restart_controller()
    wait_for(lambda: plane.rows(r_clf)["old-1"].status == D.REFUSED, WAIT_S, "clf refused when sent")
    row = plane.rows(r_clf)["old-1"]
    assert "schema 1 only" in row.detail and "clf v1, det v1" in row.detail, row.detail
    assert ("device refused", row.detail) in plane.audit(r_clf, "old-1")
    assert plane.ended(r_det).status.value == "done"
    wait_for(lambda: served(old) == {"det": 1}, WAIT_S, "old-1 on det")


def test_admission_is_predicted_from_reported_footprints_refused_or_flagged(memory_plane: MemoryPlane) -> None:
    plane = memory_plane
    det, clf = plane.package("det", 1), plane.package("clf", 1, seed=1)
    weights = sum(f.size for f in det.manifest.files if f.role == "model") / MIB
    # small: room for one model's files, not two. roomy: room for both files, not for what another device measured of
    # clf. measured: an agent of the same target that serves clf v1 at 50 MiB. unknown: no budget reported.
    plane.agents("small", memory_budget_mb=round(weights * 1.5, 4))
    plane.agents("roomy", memory_budget_mb=10.0)
    plane.agents("unknown", memory_budget_mb=None)
    plane.agents("measured", footprint={"clf@1": 50.0})
    assert plane.ended(plane.deploy(det, "id=small")).status.value == "done"
    assert plane.ended(plane.deploy(det, "id=roomy")).status.value == "done"
    assert plane.ended(plane.deploy(det, "id=unknown")).status.value == "done"
    assert plane.ended(plane.deploy(clf, "id=measured")).status.value == "done"
    wait_for(lambda: (m := plane.store.device("measured")) is not None and m.served("clf") is not None, WAIT_S,
             "the measured footprint in the store")
    _request, plan = plane.plan(clf)
    refused = {d.device_id: d.reason for d in plan.refused}
    assert list(refused) == ["small"], refused
    assert "the set needs at least" in refused["small"] and f"budget is {weights * 1.5:.3g} MB" in refused["small"]
    notes = {d.device_id: d.reason for d in plan.devices}
    assert "likely refused after staging" in notes["roomy"] and "clf v1 50" in notes["roomy"], notes["roomy"]
    assert notes["unknown"] == "" and notes["measured"] == ""
    r_clf = plane.deploy(clf)
    assert plane.ended(r_clf).status.value == "done"
    assert plane.rows(r_clf)["small"].status == D.REFUSED
    assert served(plane.fleet.agents["small"]) == {"det": 1}
