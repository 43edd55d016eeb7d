"""The decision rule of backend timing on injected timings: a fake bench and a fake clock, no real runs."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest

from agent.timing import (
    MIN_ROUNDS,
    P95_MIN_RUNS,
    TIE_MARGIN,
    Budget,
    Decision,
    Standing,
    Timing,
    contest,
    decide,
    judge,
    ratio_interval,
    resolve_tie,
)


class FakeBench:
    """Seconds per run for each candidate: a true speed times noise, on a clock that the runs advance.

    ``noise`` is the log-normal sigma of one run; ``neighbour`` slows every run of odd rounds by that
    factor (a noisy neighbour that comes and goes); ``tail`` makes every 10th run of a candidate that
    many times slower.
    """

    def __init__(self, seconds: Sequence[float], noise: float = 0.05, seed: int = 0, neighbour: float = 1.0,
                 tail: Sequence[float] | None = None) -> None:
        self.seconds = list(seconds)
        self.noise = noise
        self.rng = np.random.default_rng(seed)
        self.neighbour = neighbour
        self.tail = list(tail) if tail is not None else [1.0] * len(seconds)
        self.now = 0.0
        self.blocks = [0] * len(seconds)
        self.runs = [0] * len(seconds)

    def clock(self) -> float:
        return self.now

    def run_block(self, index: int, runs: int) -> list[float]:
        slow = self.neighbour if self.blocks[index] % 2 else 1.0
        self.blocks[index] += 1
        times = []
        for _ in range(runs):
            self.runs[index] += 1
            tail = self.tail[index] if self.runs[index] % 10 == 0 else 1.0
            times.append(self.seconds[index] * slow * tail * float(self.rng.lognormal(0.0, self.noise)))
        self.now += sum(times)
        return times


def run(bench: FakeBench, names: Sequence[str] = ("a", "b"), budget_s: float = 5.0,
        memory_mb: Sequence[float | None] | None = None) -> Decision:
    memory = (lambda index: memory_mb[index]) if memory_mb is not None else None
    return contest(names, bench.run_block, budget=Budget(budget_s), clock=bench.clock, memory=memory).decision


def test_a_clearly_faster_backend_wins_beyond_the_noise_before_the_budget() -> None:
    bench = FakeBench([0.010, 0.0125])
    decision = run(bench)
    assert (decision.winner, decision.runner_up, decision.tie, decision.rule) == ("a", "b", False, "faster")
    assert decision.low is not None and decision.low > 1.0 and decision.ratio == pytest.approx(1.25, rel=0.05)
    assert decision.blocks >= MIN_ROUNDS and bench.now < 5.0


@pytest.mark.parametrize("seed", range(12))
def test_the_slower_backend_is_never_picked_under_heavy_noise(seed: int) -> None:
    """The bug of issue 14: a 1.25x slower backend picked half the time. Order of listing must not matter either."""
    for names, seconds in ((("a", "b"), [0.100, 0.125]), (("b", "a"), [0.125, 0.100])):
        decision = run(FakeBench(seconds, noise=0.3, seed=seed), names, budget_s=30.0)
        assert decision.winner == "a", decision


def test_a_neighbour_that_comes_and_goes_slows_both_alike() -> None:
    """Interleaved rounds pair the blocks: a 3x slowdown in every other round does not hide a 1.25x difference."""
    decision = run(FakeBench([0.0125, 0.010], noise=0.05, neighbour=3.0))
    assert decision.winner == "b" and not decision.tie and decision.ratio == pytest.approx(1.25, rel=0.05)


def test_equal_speeds_are_a_tie_found_before_the_budget_and_resolved_by_order() -> None:
    bench = FakeBench([0.010, 0.010], noise=0.02)
    decision = run(bench, memory_mb=[50.0, 50.5])
    assert (decision.winner, decision.tie, decision.rule) == ("a", True, "order")
    assert decision.low is not None and decision.high is not None
    assert 1 / (1 + TIE_MARGIN) <= decision.low <= decision.high <= 1 + TIE_MARGIN
    assert bench.now < 5.0


def test_a_tie_goes_to_the_lower_memory_when_p95s_are_alike() -> None:
    decision = run(FakeBench([0.010, 0.010], noise=0.02), memory_mb=[120.0, 80.0])
    assert (decision.winner, decision.tie, decision.rule) == ("b", True, "memory")


def test_a_tie_goes_to_the_lower_p95_first() -> None:
    """Same median, but every 10th run of 'a' is 3x slower: 'b' has the lower p95."""
    decision = run(FakeBench([0.010, 0.010], noise=0.01, tail=[3.0, 1.0]), memory_mb=[10.0, 90.0])
    assert (decision.winner, decision.tie, decision.rule) == ("b", True, "p95")


def test_while_the_noise_never_clears_it_keeps_measuring_to_the_budget_then_picks_by_the_estimate() -> None:
    """No tie called on no evidence: the interval straddles 1 and reaches beyond the band, so memory never decides."""
    asked: list[int] = []

    def memory(index: int) -> float:
        asked.append(index)
        return [200.0, 10.0][index]  # the memory rule would pick b

    bench = FakeBench([0.100, 0.103], noise=0.4, seed=3)
    result = contest(["a", "b"], bench.run_block, budget=Budget(3.0), clock=bench.clock, memory=memory)
    decision = result.decision
    assert (decision.tie, decision.rule, asked) == (False, "estimate", [])
    assert decision.low is not None and decision.high is not None and decision.low < 1.0 < decision.high
    assert not 1 / (1 + TIE_MARGIN) <= decision.low <= decision.high <= 1 + TIE_MARGIN
    winner = result.winner
    assert decision.winner == "ab"[winner] and result.timings[winner].blocks  # the leader by the estimate
    log_means = [np.mean(np.log(list(t.blocks.values()))) for t in result.timings]
    assert winner == int(np.argmin(log_means))
    assert bench.now >= 3.0 and decision.blocks > MIN_ROUNDS and decision.budget_s == 3.0


def test_the_round_budget_ends_the_measuring_too() -> None:
    bench = FakeBench([0.100, 0.100], noise=0.4, seed=3)
    decision = contest(["a", "b"], bench.run_block, budget=Budget(3600.0, rounds=8), clock=bench.clock).decision
    assert (decision.blocks, decision.rule) == (8, "estimate") and bench.now < 3600.0


def test_the_minimum_rounds_hold_whatever_the_budget() -> None:
    bench = FakeBench([0.5, 0.5], noise=0.3, seed=1)
    decision = run(bench, budget_s=0.1)
    assert decision.blocks == MIN_ROUNDS and decision.rule == "estimate" and not decision.tie


@pytest.mark.parametrize("seed", range(12))
def test_a_backend_1_3x_faster_wins_under_heavy_noise_whatever_memory_and_order_say(seed: int) -> None:
    """The bug of issue 21: 1.3-1.7x faster backends lost to the tie rule (memory, then order) on a short budget."""
    decision = run(FakeBench([0.013, 0.010], noise=0.3, seed=seed, neighbour=2.0), budget_s=3.0, memory_mb=[10.0, 500.0])
    assert decision.winner == "b" and not decision.tie and decision.rule in {"faster", "estimate"}, decision


def test_a_candidate_slower_beyond_the_noise_stops_being_timed() -> None:
    bench = FakeBench([0.010, 0.030, 0.010], noise=0.15)
    decision = run(bench, names=("a", "slow", "c"), memory_mb=[30.0, 30.0, 30.0])
    assert decision.winner in {"a", "c"} and decision.runner_up == ({"a", "c"} - {decision.winner}).pop()
    assert bench.blocks[1] < bench.blocks[0] == bench.blocks[2]


def _blocks(*ratios: Sequence[float]) -> list[dict[int, float]]:
    """Block medians by round: candidate 0 at 10 ms, each other at 10 ms times its ratio in that round."""
    rounds = len(ratios[0])
    return [{r: 0.010 for r in range(rounds)}] + [{r: 0.010 * q for r, q in enumerate(qs)} for qs in ratios]


def test_judge_calls_a_tie_only_inside_the_noise_band() -> None:
    inside = _blocks([1.01, 0.99, 1.02, 1.00, 1.01, 0.995, 1.005, 1.01])
    assert judge(inside, [0, 1]) == Standing(leader=0, tied=(1,))
    # The same mean, but the interval reaches past 1.05: not a tie, not slower either; unsure.
    wide = _blocks([1.10, 0.92, 1.12, 0.95, 1.01, 0.90, 1.15, 0.93])
    assert judge(wide, [0, 1]) == Standing(leader=0, unsure=(1,))
    assert not judge(wide, [0, 1]).settled and judge(inside, [0, 1]).settled


def test_judge_puts_a_candidate_slower_beyond_the_noise_out_and_the_leader_first() -> None:
    standing = judge(_blocks([1.31, 1.29, 1.33, 1.30, 1.28], [0.99, 1.01, 1.0, 1.02, 0.98]), [0, 1, 2])
    assert (standing.leader, standing.slower, set(standing.tied)) == (0, (1,), {2}) or standing.leader == 2
    assert standing.live == [standing.leader, *standing.tied] and 1 not in standing.live
    faster_second = judge(_blocks([0.70, 0.72, 0.69, 0.71, 0.70]), [0, 1])
    assert (faster_second.leader, faster_second.slower) == (1, (0,))


def test_decide_asks_memory_only_for_a_true_tie() -> None:
    timings = [Timing(tuple([0.010] * 10), {r: 0.010 for r in range(5)}),
               Timing(tuple([0.010] * 10), {r: 0.0101 for r in range(5)})]
    asked: list[int] = []

    def memory(index: int) -> float:
        asked.append(index)
        return [300.0, 20.0][index]

    unsure = decide(["a", "b"], timings, Standing(0, unsure=(1,)), 5, memory)
    assert (unsure.decision.winner, unsure.decision.rule, unsure.decision.tie, asked) == ("a", "estimate", False, [])
    slower = decide(["a", "b"], timings, Standing(0, slower=(1,)), 5, memory)
    assert (slower.decision.winner, slower.decision.rule, asked) == ("a", "faster", [])
    tied = decide(["a", "b"], timings, Standing(0, tied=(1,)), 5, memory)
    assert (tied.decision.winner, tied.decision.rule, tied.decision.tie) == ("b", "memory", True)
    assert sorted(asked) == [0, 1] and tied.memory_mb == {0: 300.0, 1: 20.0}


def test_a_single_candidate_is_timed_and_chosen() -> None:
    decision = run(FakeBench([0.01]), names=("only",))
    assert (decision.winner, decision.runner_up, decision.rule, decision.tie) == ("only", None, "only", False)
    assert decision.ratio is None and decision.blocks == MIN_ROUNDS


def test_tie_rule_without_enough_runs_skips_p95() -> None:
    few = Timing(tuple([0.01] * (P95_MIN_RUNS - 1)), {}), Timing(tuple([0.01] * (P95_MIN_RUNS - 2) + [0.05]), {})
    assert resolve_tie([0, 1], few, lambda i: None) == (0, "order")
    assert resolve_tie([0, 1], few, [80.0, 40.0].__getitem__) == (1, "memory")
    assert resolve_tie([0, 1], few, [40.0, 42.0].__getitem__) == (0, "order")  # within 4 MiB: alike
    many = Timing(tuple([0.01] * 17 + [0.05] * 3), {}), Timing(tuple([0.01] * 20), {})
    assert resolve_tie([0, 1], many, lambda i: None) == (1, "p95")
    assert resolve_tie([1, 0], many[::-1], [5.0, 5.0].__getitem__) == (0, "p95")


def test_p95_that_differs_only_by_noise_does_not_decide() -> None:
    """Two draws of one distribution: their p95s differ, but not beyond the noise, so memory decides."""
    rng = np.random.default_rng(11)
    a, b = (Timing(tuple(rng.lognormal(-4.6, 0.4, 60).tolist()), {}) for _ in range(2))
    assert abs(a.p95_s / b.p95_s - 1) > 0.05  # the plain p95 rule would have picked by noise
    assert resolve_tie([0, 1], (a, b), [80.0, 40.0].__getitem__) == (1, "memory")
    assert resolve_tie([0, 1], (a, b), lambda i: None) == (0, "order")


def test_memory_is_asked_only_for_a_tie_that_reaches_it() -> None:
    asked: list[int] = []

    def memory(index: int) -> float:
        asked.append(index)
        return 10.0

    contest(["a", "b"], FakeBench([0.010, 0.0125]).run_block, budget=Budget(5.0), clock=FakeBench([]).clock, memory=memory)
    assert asked == []
    bench = FakeBench([0.010, 0.030, 0.010], noise=0.02)
    result = contest(["a", "slow", "c"], bench.run_block, budget=Budget(5.0), clock=bench.clock, memory=memory)
    assert result.decision.rule == "order" and sorted(asked) == [0, 2] and result.memory_mb == {0: 10.0, 2: 10.0}


def test_interval_matches_student_t() -> None:
    stats = pytest.importorskip("scipy.stats", reason="scipy gives the exact t quantile to compare with")
    rng = np.random.default_rng(7)
    fast = rng.lognormal(0, 0.1, 8)
    slow = fast * 1.2 * rng.lognormal(0, 0.05, 8)
    iv = ratio_interval(slow.tolist(), fast.tolist(), confidence=0.99)
    diffs = np.log(slow) - np.log(fast)
    half = stats.t.ppf(0.995, 7) * diffs.std(ddof=1) / math.sqrt(8)
    assert iv.ratio == pytest.approx(math.exp(diffs.mean()))
    assert (iv.low, iv.high) == pytest.approx((math.exp(diffs.mean() - half), math.exp(diffs.mean() + half)), rel=2e-3)
    assert ratio_interval([1.0], [1.0]).high == math.inf


def test_decision_round_trips_through_json_form() -> None:
    decision = run(FakeBench([0.010, 0.0125]))
    assert Decision.from_dict(decision.to_dict()).to_dict() == decision.to_dict()
    open_ended = Decision("a", "b", 1.1, 0.0, math.inf, 1, True, "order")
    assert open_ended.to_dict()["interval"] == [0.0, None]
    assert Decision.from_dict(open_ended.to_dict()).high is None
