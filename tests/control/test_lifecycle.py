"""The rollout lifecycle table, edge by edge, and the engine driving each edge (no broker: a recording publisher).

The expected edges are written out here, not read from the table, so adding or changing an edge
in :mod:`edgectl.controller.lifecycle` fails until this table says the same.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from edgecore.errors import UserError
from edgecore.protocol.reports import DeviceEvent
from edgectl.controller.engine import Engine
from edgectl.controller.lifecycle import DECISIONS, REQUESTS, TRANSITIONS, IllegalTransition, RolloutEvent, advance
from edgectl.controller.records import (
    DeviceStatus,
    ModelRef,
    PackageRef,
    Phase,
    RolloutDevice,
    RolloutRow,
    RolloutSpec,
    RolloutStatus,
)
from edgectl.controller.store import SqliteStore
from edgectl.fleet.approvals import ApprovalRefused, approve_rollout, reject_rollout
from tests.guards.rollout_bench import Recorder

S, E, D = RolloutStatus, RolloutEvent, DeviceStatus

EDGES = [
    (S.AWAITING_APPROVAL, E.APPROVE, S.SCHEDULED),
    (S.AWAITING_APPROVAL, E.REJECT, S.REJECTED),
    (S.AWAITING_APPROVAL, E.ABORT, S.ABORTING),
    (S.SCHEDULED, E.ABORT, S.ABORTING),
    (S.SCHEDULED, E.START, S.RUNNING),
    (S.RUNNING, E.PAUSE, S.PAUSED),
    (S.PAUSED, E.RESUME, S.RUNNING),
    (S.RUNNING, E.ABORT, S.ABORTING),
    (S.PAUSED, E.ABORT, S.ABORTING),
    (S.RUNNING, E.RETRY_FAILED, S.RUNNING),
    (S.PAUSED, E.RETRY_FAILED, S.PAUSED),
    (S.DONE, E.RETRY_FAILED, S.RUNNING),
    (S.RUNNING, E.HALT, S.ROLLING_BACK),
    (S.PAUSED, E.HALT, S.ROLLING_BACK),
    (S.RUNNING, E.COMPLETE, S.DONE),
    (S.ROLLING_BACK, E.SETTLED, S.ROLLED_BACK),
    (S.ABORTING, E.SETTLED, S.ABORTED),
]


@pytest.mark.parametrize(("before", "event", "after"), EDGES, ids=[f"{b.value}-{e.value}" for b, e, _ in EDGES])
def test_each_edge_of_the_table(before: RolloutStatus, event: RolloutEvent, after: RolloutStatus) -> None:
    assert advance(before, event) is after


def test_the_table_holds_exactly_the_expected_edges() -> None:
    assert dict(TRANSITIONS) == {(b, e): a for b, e, a in EDGES}


def test_every_other_pair_is_refused_and_final_statuses_have_no_way_out_but_retry() -> None:
    legal = {(b, e) for b, e, _ in EDGES}
    for status, event in itertools.product(RolloutStatus, RolloutEvent):
        if (status, event) not in legal:
            with pytest.raises(IllegalTransition, match=f"rollout is {status.value}: {event.value} does not apply"):
                advance(status, event)
    assert [e for (s, e) in legal if s in (S.ROLLED_BACK, S.ABORTED, S.REJECTED)] == []


def test_operator_requests_are_read_off_the_table() -> None:
    assert REQUESTS == {"pause": (S.RUNNING,), "resume": (S.PAUSED,),
                        "abort": (S.AWAITING_APPROVAL, S.SCHEDULED, S.RUNNING, S.PAUSED),
                        "retry-failed": (S.RUNNING, S.PAUSED, S.DONE)}


def test_a_second_operators_decisions_are_read_off_the_table() -> None:
    assert DECISIONS == {"approve": (S.AWAITING_APPROVAL,), "reject": (S.AWAITING_APPROVAL,)}


def test_statuses_keep_their_stored_names() -> None:
    assert [s.value for s in RolloutStatus] == ["scheduled", "awaiting-approval", "running", "paused", "rolling-back",
                                                "aborting", "rolled-back", "aborted", "done", "rejected"]
    assert f"{S.ROLLING_BACK}" == str(S.ROLLING_BACK) == "rolling-back"
    assert [p.value for p in Phase] == ["start", "installing", "baking", "waiting", "rollback"]


# -- the engine goes through the table ----------------------------------------------------------------


class Bench:
    """A store with two online devices and one two-wave rollout, an engine on a hand-moved clock."""

    def __init__(self, path: Path, waves: int = 2, status: RolloutStatus = S.RUNNING, start_at: float | None = None) -> None:
        self.now = 1000.0
        self.store = SqliteStore(path / "store.db")
        self.publisher = Recorder()
        self.engine = Engine(self.store, self.publisher, lambda _t, _b: None, clock=lambda: self.now)
        package = PackageRef("v1", "a1", "clf", 2, "any", "clf v2 (any)", str(path / "clf.edgepkg"), 10)
        spec = RolloutSpec("all", (package,), waves, 0.0, 0.0, ("failure_rate <= 0%", "silence <= 60s"), 60.0, wave_timeout_s=30,
                           start_at=start_at, created_by="api:alice",
                           approval="targets protected group plant" if status is S.AWAITING_APPROVAL else "")
        for device in ("d1", "d2"):
            self.store.upsert_device(device, online=1, last_seen=self.now)
        rows = [RolloutDevice("r1", "d1", 1, "v1", D.PLANNED), RolloutDevice("r1", "d2", waves, "v1", D.PLANNED)]
        self.store.create_rollout(RolloutRow("r1", self.now, status, spec, wave=1, phase=Phase.START), rows)

    def status(self) -> RolloutStatus:
        row = self.store.rollout("r1")
        assert row is not None
        return row.status

    def report(self, device: str, status: str, state: str = "done") -> None:
        self.engine.reports.on_event(device, DeviceEvent(device, "r1", state, status, "", self.now))

    def tick(self, times: int = 1) -> RolloutStatus:
        for _ in range(times):
            self.engine.tick()
        return self.status()

    def request(self, action: str) -> RolloutStatus:
        self.engine.request("r1", action)
        return self.status()


def test_engine_complete_after_the_last_wave(tmp_path: Path) -> None:
    bench = Bench(tmp_path, waves=1)
    bench.tick()  # wave 1 starts: both devices sent
    assert sorted(bench.publisher.sent) == [("desired", "d1"), ("desired", "d2")]
    bench.report("d1", "ok")
    bench.report("d2", "ok")
    assert bench.tick(2) is S.DONE  # installed -> baking (0 s) -> promoted, the last wave


def test_engine_pause_resume_and_retry_while_running_or_paused(tmp_path: Path) -> None:
    bench = Bench(tmp_path)
    assert bench.request("pause") is S.PAUSED
    assert bench.request("pause") is S.PAUSED  # not an edge: ignored, and said so in the audit log
    assert bench.request("retry-failed") is S.PAUSED
    assert bench.request("resume") is S.RUNNING
    assert bench.request("retry-failed") is S.RUNNING
    actions = [a.action for a in bench.store.audit_log("r1")]
    assert actions.count("pause ignored") == 1 and "resume" in actions


@pytest.mark.parametrize("paused", [False, True])
def test_engine_halt_then_settled_rolls_back(tmp_path: Path, paused: bool) -> None:
    bench = Bench(tmp_path)
    bench.tick()
    bench.report("d1", "ok")
    if paused:
        bench.request("pause")
    bench.report("d1", "failed", "health")  # failure_rate <= 0% cannot hold
    assert bench.tick() is S.ROLLING_BACK
    row = {r.device_id: r for r in bench.store.rollout_devices("r1")}
    assert row["d2"].status is D.CANCELLED  # wave 2 never sent
    bench.report("d1", "rolled-back", "rollback")
    assert bench.tick() is S.ROLLED_BACK


@pytest.mark.parametrize("paused", [False, True])
def test_engine_abort_then_settled_rolls_back_what_was_taken(tmp_path: Path, paused: bool) -> None:
    bench = Bench(tmp_path)
    bench.tick()
    bench.report("d1", "ok")
    if paused:
        bench.request("pause")
    assert bench.request("abort") is S.ABORTING
    assert ("rollback", "d1") in bench.publisher.sent
    assert bench.tick() is S.ABORTING  # d1 has not confirmed yet
    bench.now += 31  # the wave timeout passes: settled without it
    assert bench.tick() is S.ABORTED
    assert bench.request("resume") is S.ABORTED and bench.request("abort") is S.ABORTED


def test_engine_retry_failed_reopens_a_done_rollout(tmp_path: Path) -> None:
    bench = Bench(tmp_path, waves=1)
    with bench.store.batch():
        rollout = bench.store.rollout("r1")
        assert rollout is not None
        rollout.status, rollout.phase, rollout.spec = S.DONE, Phase.BAKING, RolloutSpec.from_dict(
            {**rollout.spec.to_dict(), "gates": ["silence <= 60s"]})
        bench.store.save_rollout(rollout)
        bench.store.save_rollout_device(RolloutDevice("r1", "d1", 1, "v1", D.FAILED))
    assert bench.request("retry-failed") is S.RUNNING
    assert ("desired", "d1") in bench.publisher.sent


def test_engine_refuses_an_edge_the_table_lacks(tmp_path: Path) -> None:
    bench = Bench(tmp_path)
    rollout = bench.store.rollout("r1")
    assert rollout is not None
    with pytest.raises(IllegalTransition):
        bench.engine._transition(rollout, E.SETTLED)  # running cannot settle: only a halted or aborted rollout does
    assert bench.status() is S.RUNNING


# -- scheduled rollouts and approvals (the start by the engine's clock; approve and reject in edgectl.fleet.approvals) --


def test_engine_starts_a_scheduled_rollout_at_its_start_time_by_its_clock(tmp_path: Path) -> None:
    bench = Bench(tmp_path, status=S.SCHEDULED, start_at=1060.0)
    assert bench.tick() is S.SCHEDULED and bench.publisher.sent == []  # nothing sent before the start time
    bench.now = 1059.9
    assert bench.tick() is S.SCHEDULED
    bench.now = 1060.0
    assert bench.tick() is S.RUNNING  # started and its first wave sent on the same tick
    assert bench.publisher.sent == [("desired", "d1")]
    started = [a for a in bench.store.audit_log("r1") if a.action == "rollout started"]
    assert len(started) == 1 and "1970-01-01T00:17:40Z reached" in started[0].detail


@pytest.mark.parametrize("status", [S.SCHEDULED, S.AWAITING_APPROVAL])
def test_engine_abort_before_the_start_cancels_every_device(tmp_path: Path, status: RolloutStatus) -> None:
    bench = Bench(tmp_path, status=status, start_at=5000.0)
    assert bench.request("abort") is S.ABORTING
    assert bench.tick() is S.ABORTED  # nothing was sent: nothing to wait for
    assert {r.status for r in bench.store.rollout_devices("r1")} == {D.CANCELLED}
    bench.now = 6000.0
    assert bench.tick() is S.ABORTED and bench.publisher.sent == []


def test_a_rollout_awaiting_approval_is_never_started_by_the_engine(tmp_path: Path) -> None:
    bench = Bench(tmp_path, status=S.AWAITING_APPROVAL)
    bench.now += 10_000
    assert bench.tick(3) is S.AWAITING_APPROVAL and bench.publisher.sent == []
    assert bench.request("pause") is S.AWAITING_APPROVAL  # not an edge: ignored


def test_approval_by_a_second_operator_then_the_engine_starts_it(tmp_path: Path) -> None:
    bench = Bench(tmp_path, status=S.AWAITING_APPROVAL, start_at=2000.0)
    with pytest.raises(ApprovalRefused, match="two-person rule: cli:alice created rollout r1"):
        approve_rollout(bench.store, "r1", "cli:alice")  # api:alice made it: the same person by another way in
    assert bench.status() is S.AWAITING_APPROVAL
    assert approve_rollout(bench.store, "r1", "api:bob").status is S.SCHEDULED
    with pytest.raises(UserError, match="cannot approve rollout r1: it is scheduled"):
        approve_rollout(bench.store, "r1", "api:carol")
    assert bench.tick() is S.SCHEDULED  # approved, still before its start time
    bench.now = 2000.0
    assert bench.tick() is S.RUNNING
    log = [(a.actor, a.action) for a in bench.store.audit_log("r1")]
    assert ("api:bob", "rollout approved") in log and ("controller", "rollout started") in log


def test_rejection_ends_it_with_the_reason_and_cancels_its_devices(tmp_path: Path) -> None:
    bench = Bench(tmp_path, status=S.AWAITING_APPROVAL)
    with pytest.raises(UserError, match="reason: say why"):
        reject_rollout(bench.store, "r1", "api:bob", "  ")
    assert bench.status() is S.AWAITING_APPROVAL
    rejected = reject_rollout(bench.store, "r1", "api:bob", "not before the audit")
    assert rejected.status is S.REJECTED and rejected.reason == "rejected by api:bob: not before the audit"
    assert {r.status for r in bench.store.rollout_devices("r1")} == {D.CANCELLED}
    assert bench.tick() is S.REJECTED and bench.publisher.sent == []
    with pytest.raises(UserError, match="cannot reject rollout r1: it is rejected"):
        reject_rollout(bench.store, "r1", "api:bob", "again")


# -- records at the store boundary -----------------------------------------------------------------------


def test_a_spec_stored_before_later_keys_existed_still_reads(tmp_path: Path) -> None:
    """A rollout stored by an older edgectl (no shadow, allow_downgrade, wave_timeout_s) reads with defaults."""
    store = SqliteStore(tmp_path / "old.db")
    old = {"selector": "all", "wave_count": 1, "max_failure": 0.05, "bake_s": 60.0, "gates": ["failure_rate <= 5%"],
           "silence_s": 60.0, "packages": [{"variant": "v", "artifact_id": "a", "name": "clf", "version": 3, "target": "any",
                                            "label": "clf v3 (any)", "path": "/p.edgepkg", "size": 1}], "extra": "ignored"}
    with store.batch():
        store._db().execute("INSERT INTO rollouts VALUES (?,?,?,?,?,?,?,?,?)",
                            ("r0", 1.0, "running", json.dumps(old), 1, "baking", 1.0, "", 1.0))
        store._db().execute("INSERT INTO rollout_devices VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                            ("r0", "d", 1, "v", "ok", "done", "", "{}", None, "{}", None, 1.0))
    rollout = store.rollout("r0")
    assert rollout is not None and rollout.status is S.RUNNING and rollout.phase is Phase.BAKING
    assert rollout.spec.wave_timeout_s == 600.0 and rollout.spec.shadow is False and rollout.spec.package("v").version == 3
    row = store.rollout_devices("r0")[0]
    assert row.status is D.OK and row.previous == ModelRef()
    store.save_rollout(rollout)
    again = store.rollout("r0")
    assert again is not None and again.spec == rollout.spec
