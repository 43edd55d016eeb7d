"""The wave failure budget at mid-range values, through the operator's path: plan, submit, engine, gates.

``--max-failure`` becomes the ``failure_rate`` gate, and that gate alone decides, while the wave
installs and while it bakes. A budget of B over N devices tolerates exactly the failure counts F
with F / N <= B: the rows below sit where rounding B * N down, up or to the nearest would each
give another answer (20% of 4 is 0.8 devices: none may fail; 34% of 3 is 1.02: one may; 70% of 4
is 2.8: two may, not three).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from edgectl.controller.records import DeviceStatus, Phase, RolloutStatus
from tests.guards.rollout_bench import RolloutBench

S = RolloutStatus

BUDGETS = [  # (max_failure, devices, failures the wave survives)
    (0.0, 3, 0),
    (0.20, 4, 0),
    (0.20, 5, 1),
    (0.25, 4, 1),  # exactly at the budget: holds
    (0.33, 3, 0),
    (0.34, 3, 1),
    (0.50, 4, 2),
    (0.60, 4, 2),
    (0.70, 4, 2),
    (0.75, 4, 3),
    (0.90, 10, 9),
]


def _fail(bench: RolloutBench, devices: list[str]) -> None:
    for device in devices:
        bench.report(device, "failed", "health")


@pytest.mark.parametrize(("budget", "devices", "tolerated"), BUDGETS, ids=[f"{b:.0%}-of-{n}" for b, n, _ in BUDGETS])
def test_the_first_failure_over_the_budget_halts_the_wave_while_it_installs(tmp_path: Path, budget: float, devices: int,
                                                                            tolerated: int) -> None:
    bench = RolloutBench(tmp_path, devices)
    bench.submit(budget)
    assert bench.tick() == (S.RUNNING, Phase.INSTALLING)
    _fail(bench, bench.online[:tolerated])
    assert bench.tick() == (S.RUNNING, Phase.INSTALLING), "halted within the budget"
    _fail(bench, [bench.online[tolerated]])
    status, phase = bench.tick()
    assert (status, phase) == (S.ROLLING_BACK, Phase.ROLLBACK), f"{tolerated + 1} of {devices} failed and it went on"
    rollout = bench.rollout()
    assert f"gate 'failure_rate <= {budget * 100:g}%' failed" in rollout.reason and "wave 1" in rollout.reason
    assert rollout.reason.endswith(f"(failure_rate = {100 * (tolerated + 1) / devices:.1f}%)")


@pytest.mark.parametrize(("budget", "devices", "tolerated"), [b for b in BUDGETS if b[2] > 0],
                         ids=[f"{b:.0%}-of-{n}" for b, n, t in BUDGETS if t > 0])
def test_a_wave_within_its_budget_is_promoted(tmp_path: Path, budget: float, devices: int, tolerated: int) -> None:
    bench = RolloutBench(tmp_path, devices)
    bench.submit(budget)
    bench.tick()
    _fail(bench, bench.online[:tolerated])
    for device in bench.online[tolerated:]:
        bench.report(device, "ok")
    assert bench.tick() == (S.RUNNING, Phase.BAKING)
    assert bench.tick()[0] is S.DONE  # the same gate holds while baking: promoted, the last wave


def test_a_rolled_back_device_counts_as_a_failure(tmp_path: Path) -> None:
    bench = RolloutBench(tmp_path, 4)
    bench.submit(0.25)
    bench.tick()
    bench.report("d0", "rolled-back", "rollback")
    assert bench.tick()[0] is S.RUNNING
    bench.report("d1", "rolled-back", "rollback")
    assert bench.tick()[0] is S.ROLLING_BACK


def test_devices_not_sent_the_update_do_not_count(tmp_path: Path) -> None:
    """Offline devices wait (deferred): one failure of the 4 online ones is 25%, over a 20% budget, not 1 in 6."""
    bench = RolloutBench(tmp_path, 4, offline=2)
    bench.submit(0.20)
    bench.tick()
    assert sorted(d for d, r in bench.rows().items() if r.status is DeviceStatus.DEFERRED) == ["off0", "off1"]
    bench.report("d0", "failed", "health")
    assert bench.tick()[0] is S.ROLLING_BACK


def test_devices_of_later_waves_do_not_count(tmp_path: Path) -> None:
    """Wave 1 of ``2,100%`` over 10 devices: one failure of its 2 is 50%, over a 40% budget."""
    bench = RolloutBench(tmp_path, 10)
    bench.submit(0.40, waves="2,100%")
    bench.tick()
    assert len(bench.in_flight()) == 2
    bench.report(bench.in_flight()[0], "failed", "health")
    assert bench.tick()[0] is S.ROLLING_BACK


def test_a_failure_rate_gate_given_by_the_operator_is_the_budget(tmp_path: Path) -> None:
    """One rule: an explicit ``failure_rate`` gate replaces ``--max-failure``, while installing as while baking."""
    bench = RolloutBench(tmp_path, 4)
    bench.submit(0.0, gates=["failure_rate <= 50%"])
    assert [g for g in bench.rollout().spec.gates if g.startswith("failure_rate")] == ["failure_rate <= 50%"]
    bench.tick()
    _fail(bench, ["d0", "d1"])
    assert bench.tick() == (S.RUNNING, Phase.INSTALLING)
    bench.report("d2", "failed", "health")
    assert bench.tick()[0] is S.ROLLING_BACK


def test_a_strict_operator_gate_halts_as_soon_as_it_fails(tmp_path: Path) -> None:
    bench = RolloutBench(tmp_path, 4)
    bench.submit(0.5, gates=["failure_rate < 25%"])
    bench.tick()
    bench.report("d0", "failed", "health")
    status, _ = bench.tick()
    assert status is S.ROLLING_BACK and "failure_rate < 25%" in bench.rollout().reason


def test_a_halt_rolls_back_what_was_taken_and_withdraws_the_rest(tmp_path: Path) -> None:
    bench = RolloutBench(tmp_path, 4)
    bench.submit(0.20)
    bench.tick()
    bench.report("d0", "ok")
    bench.report("d1", "failed", "health")
    assert bench.tick()[0] is S.ROLLING_BACK
    assert ("rollback", "d0") in bench.publisher.sent
    assert {("cancel", "d2"), ("cancel", "d3")} <= set(bench.publisher.sent)
