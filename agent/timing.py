"""Which candidate backend is faster, or a tie: interleaved block timing and the decision rule.

Every candidate is warmed up, then timed in rounds: in each round every candidate still in the
contest runs one block (a few runs, the order rotating round by round), so a noisy neighbour or a
thermal drift slows all of them alike. A round gives one *paired* figure per candidate pair, the
log of the ratio of their block medians; the mean of those over the rounds, with a Student-t
interval at ``CONFIDENCE``, says how much slower one candidate is than the other and how sure that
is. After ``MIN_ROUNDS`` rounds, and after every round from then on, ``judge`` places every other
candidate against the leader (lowest geometric mean of block medians):

- **tied**: its interval lies wholly within the noise band ``1 +- TIE_MARGIN``: the same speed;
- **slower**: its interval lies wholly above 1 (and not within the band): it leaves the contest;
- **unsure**: neither: the measurement cannot tell yet, so the contest keeps measuring.

The contest stops as soon as no candidate is unsure, or when its ``Budget`` (seconds and rounds)
runs out. ``decide`` then names the winner and the rule that decided:

- ``faster``: the leader is faster beyond the noise than every other candidate;
- ``estimate``: the budget ran out while some candidate was still unsure: the leader, the faster by
  the point estimate, wins; it is not a tie, and memory or order never decide it;
- ``p95``, ``memory``, ``order``: a true tie (every remaining interval within the band), resolved by
  the fixed rule ``resolve_tie``;
- ``only``: one candidate.

The timing itself is a seam: ``contest`` takes ``run_block(index, runs)`` (seconds per counted run)
and a ``clock``, so the rule is tested on injected timings and used on real runners; ``judge`` and
``decide`` are pure functions of the block medians and samples.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from statistics import NormalDist
from typing import Any

import numpy as np

__all__ = [
    "CONFIDENCE",
    "MAX_ROUNDS",
    "MIN_ROUNDS",
    "TIE_MARGIN",
    "Budget",
    "Contest",
    "Decision",
    "Interval",
    "RunBlock",
    "Standing",
    "Timing",
    "contest",
    "decide",
    "judge",
    "ratio_interval",
    "resolve_tie",
]

RunBlock = Callable[[int, int], Sequence[float]]  # (candidate index, runs) -> seconds of each counted run
Clock = Callable[[], float]
Memory = Callable[[int], "float | None"]  # candidate index -> MiB it takes (None: unknown); asked only to break a tie

CONFIDENCE = 0.99  # two-sided; high because the contest looks at its interval after every round
TIE_MARGIN = 0.05  # the noise band: ratios within 1 +- 5% are the same speed
MIN_ROUNDS = 5  # at least 4 degrees of freedom, whatever the budget
MAX_ROUNDS = 400
WARMUP_RUNS = 3
ROUNDS_IN_BUDGET = 10  # blocks are sized so that the budget holds about this many rounds
MAX_BLOCK_RUNS = 50
P95_MARGIN = 0.05  # a tie goes to the lower p95 only when it is lower by more than this share, beyond the noise
P95_MIN_RUNS = 20  # ... and only from this many runs each (below, the p95 is the slowest run: one outlier)
BOOTSTRAP = 200  # resamples for the p95 ratio's interval (fixed seed: the same data gives the same answer)
BOOTSTRAP_MAX_RUNS = 5000
MEMORY_MARGIN = 0.10  # ... then to the lower memory when lower by more than this share
MEMORY_FLOOR_MB = 4.0  # ... and by more than this many MiB
RULES = ("only", "faster", "estimate", "p95", "memory", "order")


@dataclass(frozen=True)
class Budget:
    """How long a contest may keep measuring while it cannot tell: seconds, and rounds (``MIN_ROUNDS`` always run)."""

    seconds: float
    rounds: int = MAX_ROUNDS


@dataclass(frozen=True)
class Interval:
    """How many times slower one candidate is than another: the estimate and its interval."""

    ratio: float
    low: float
    high: float
    rounds: int

    def above(self, bound: float) -> bool:
        return self.low > bound

    def within(self, margin: float) -> bool:
        return self.low >= 1 / (1 + margin) and self.high <= 1 + margin


def ratio_interval(slow: Sequence[float], fast: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """``slow`` over ``fast`` from paired block medians: geometric mean ratio and its t-interval."""
    diffs = np.log(np.asarray(slow, np.float64)) - np.log(np.asarray(fast, np.float64))
    rounds = len(diffs)
    if rounds == 0:
        return Interval(1.0, 0.0, math.inf, 0)
    mean = float(diffs.mean())
    if rounds < 2:
        return Interval(math.exp(mean), 0.0, math.inf, rounds)
    half = _t_quantile(0.5 + confidence / 2, rounds - 1) * float(diffs.std(ddof=1)) / math.sqrt(rounds)
    return Interval(math.exp(mean), math.exp(mean - half), math.exp(mean + half), rounds)


def _t_quantile(p: float, dof: int) -> float:
    """Student-t quantile by its Cornish-Fisher expansion (within 0.3% of the exact one from 4 dof)."""
    z = NormalDist().inv_cdf(p)
    terms = [
        (z**3 + z) / 4,
        (5 * z**5 + 16 * z**3 + 3 * z) / 96,
        (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384,
        (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160,
    ]
    return z + sum(term / float(dof) ** (power + 1) for power, term in enumerate(terms))


@dataclass(frozen=True)
class Timing:
    """One candidate's counted runs (seconds) and its block medians by round."""

    samples: tuple[float, ...]
    blocks: Mapping[int, float]

    @property
    def median_s(self) -> float:
        return float(np.median(self.samples))

    @property
    def p95_s(self) -> float:
        return float(np.percentile(self.samples, 95))


@dataclass(frozen=True)
class Decision:
    """Why the winner won: the rule, and against the runner-up the ratio (runner-up over winner) and its interval.

    ``tie`` is true only for a true tie (rules p95, memory, order): every interval within ``margin``.
    ``budget_s`` is the time the contest could spend while unsure, ``spent_s`` what it spent (None in
    cache files written before they were recorded).
    """

    winner: str
    runner_up: str | None
    ratio: float | None
    low: float | None
    high: float | None
    blocks: int
    tie: bool
    rule: str  # one of RULES
    confidence: float = CONFIDENCE
    margin: float = TIE_MARGIN
    budget_s: float | None = None
    spent_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"winner": self.winner, "runner_up": self.runner_up, "blocks": self.blocks,
                                "tie": self.tie, "rule": self.rule, "confidence": self.confidence,
                                "margin": self.margin}
        if self.ratio is not None:
            data["ratio"] = round(self.ratio, 4)
            data["interval"] = [_finite(self.low), _finite(self.high)]
        for key in ("budget_s", "spent_s"):
            if getattr(self, key) is not None:
                data[key] = round(getattr(self, key), 3)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Decision:
        low, high = data.get("interval") or (None, None)

        def optional(key: str) -> float | None:
            return float(data[key]) if data.get(key) is not None else None

        return cls(
            winner=str(data["winner"]), runner_up=str(data["runner_up"]) if data.get("runner_up") else None,
            ratio=optional("ratio"), low=float(low) if low is not None else None,
            high=float(high) if high is not None else None, blocks=int(data["blocks"]), tie=bool(data["tie"]),
            rule=str(data["rule"]), confidence=float(data.get("confidence", CONFIDENCE)),
            margin=float(data.get("margin", TIE_MARGIN)), budget_s=optional("budget_s"), spent_s=optional("spent_s"),
        )

    def describe(self) -> str:
        """One line: the rule and, against the runner-up, the ratio and its interval."""
        if self.runner_up is None:
            return f"{self.winner}: the only candidate that passed"
        low = f"{self.low:.2f}" if self.low is not None and math.isfinite(self.low) else "?"
        high = f"{self.high:.2f}" if self.high is not None and math.isfinite(self.high) else "?"
        against = f"{self.runner_up} {self.ratio or 0:.2f}x [{low}, {high}] at {self.confidence:.0%}, {self.blocks} rounds"
        why = {
            "faster": "faster beyond the noise than",
            "estimate": f"faster by the estimate (the budget of {self.budget_s or 0:g} s ran out before the interval"
                        f" left the noise or came within +-{self.margin:.0%}) than",
        }.get(self.rule, f"a tie within +-{self.margin:.0%}, broken by {self.rule}, with")
        return f"{self.winner}: {why} {against}"


def _finite(value: float | None) -> float | None:
    """JSON has no infinity: an interval bound that is not finite is written as null."""
    return round(value, 4) if value is not None and math.isfinite(value) else None


@dataclass(frozen=True)
class Contest:
    """Every candidate's timing (in the order given), the decision, and the memory figures a tie asked for."""

    timings: tuple[Timing, ...]
    decision: Decision
    winner: int
    memory_mb: Mapping[int, float | None] = field(default_factory=dict)


@dataclass(frozen=True)
class Standing:
    """Where the candidates still in the contest stand against the leader (indices into the candidates)."""

    leader: int
    tied: tuple[int, ...] = ()  # within the noise band of the leader: the same speed
    slower: tuple[int, ...] = ()  # slower than the leader beyond the noise: out of the contest
    unsure: tuple[int, ...] = ()  # neither yet: more measuring can tell

    @property
    def live(self) -> list[int]:
        """The candidates that stay in the contest, the leader first."""
        return [self.leader, *self.tied, *self.unsure]

    @property
    def settled(self) -> bool:
        """Whether measuring more would change nothing: no candidate is unsure."""
        return not self.unsure


def judge(blocks: Sequence[Mapping[int, float]], live: Sequence[int], margin: float = TIE_MARGIN,
          confidence: float = CONFIDENCE) -> Standing:
    """Place every candidate of ``live`` against the leader, from their block medians by round (pure)."""
    leader = min(live, key=lambda i: _log_mean(blocks[i]))
    tied: list[int] = []
    slower: list[int] = []
    unsure: list[int] = []
    for i in live:
        if i == leader:
            continue
        iv = _interval(blocks, i, leader, confidence)
        (tied if iv.within(margin) else slower if iv.above(1.0) else unsure).append(i)
    return Standing(leader, tuple(tied), tuple(slower), tuple(unsure))


def contest(
    names: Sequence[str],
    run_block: RunBlock,
    *,
    budget: Budget,
    clock: Clock = time.perf_counter,
    memory: Memory | None = None,
    progress: Callable[[str], None] | None = None,
) -> Contest:
    """Time the candidates ``names`` (their order is the tie rule's fixed order) and decide.

    Measures until ``judge`` finds no candidate unsure, or ``budget`` runs out. ``memory`` is asked
    only when a true tie reaches the memory rule, and only for the tied candidates.
    """
    if not names:
        raise ValueError("a contest needs at least one candidate")
    started = clock()
    sizes = _block_sizes([run_block(i, WARMUP_RUNS) for i in range(len(names))], budget.seconds)
    samples: list[list[float]] = [[] for _ in names]
    blocks: list[dict[int, float]] = [{} for _ in names]
    live = list(range(len(names)))
    rounds = 0
    standing = Standing(0)
    while True:
        turn = rounds % len(live)
        for i in live[turn:] + live[:turn]:
            times = list(run_block(i, sizes[i]))
            samples[i] += times
            blocks[i][rounds] = float(np.median(times))
        rounds += 1
        if rounds < MIN_ROUNDS:
            continue
        standing = judge(blocks, live)
        live = standing.live
        if progress:
            progress(f"round {rounds}: {len(standing.unsure)} candidate(s) the measurement cannot tell apart yet")
        if standing.settled or clock() - started >= budget.seconds or rounds >= budget.rounds:
            break
    timings = tuple(Timing(tuple(s), dict(b)) for s, b in zip(samples, blocks, strict=True))
    result = decide(names, timings, standing, rounds, memory)
    spent = replace(result.decision, budget_s=budget.seconds, spent_s=clock() - started)
    return replace(result, decision=spent)


def decide(names: Sequence[str], timings: Sequence[Timing], standing: Standing, rounds: int,
           memory: Memory | None) -> Contest:
    """The winner and the rule that picked it, from where the candidates stood when measuring stopped.

    Unsure candidates left mean the budget ran out: the leader wins by the estimate. Memory (and
    order) are asked only for a true tie, all intervals within the band.
    """
    timings = tuple(timings)
    blocks = [t.blocks for t in timings]
    asked: dict[int, float | None] = {}
    if len(names) == 1:
        return Contest(timings, Decision(names[0], None, None, None, None, rounds, False, "only"), 0)
    if standing.unsure:
        winner, rule, tie = standing.leader, "estimate", False
    elif standing.tied:

        def memory_of(index: int) -> float | None:
            if index not in asked:
                asked[index] = memory(index) if memory is not None else None
            return asked[index]

        winner, rule = resolve_tie([standing.leader, *standing.tied], timings, memory_of)
        tie = True
    else:
        winner, rule, tie = standing.leader, "faster", False
    others = [i for i in range(len(names)) if i != winner]
    runner_up = min(others, key=lambda i: _interval(blocks, i, winner).ratio)
    iv = _interval(blocks, runner_up, winner)
    ratio, low, high = (round(v, 4) if math.isfinite(v) else v for v in (iv.ratio, iv.low, iv.high))  # as cached
    decision = Decision(names[winner], names[runner_up], ratio, low, high, rounds, tie, rule)
    return Contest(timings, decision, winner, asked)


def _block_sizes(warmups: Sequence[Sequence[float]], budget_s: float) -> list[int]:
    """Runs per block, so that one block of each candidate per round fits the budget ROUNDS_IN_BUDGET times."""
    block_s = budget_s / (len(warmups) * ROUNDS_IN_BUDGET)
    return [max(1, min(MAX_BLOCK_RUNS, int(block_s / max(float(np.median(w)) if len(w) else 0.0, 1e-9))))
            for w in warmups]


def _log_mean(blocks: Mapping[int, float]) -> float:
    return float(np.mean([math.log(value) for value in blocks.values()]))


def _interval(blocks: Sequence[Mapping[int, float]], slow: int, fast: int, confidence: float = CONFIDENCE) -> Interval:
    common = sorted(set(blocks[slow]) & set(blocks[fast]))
    return ratio_interval([blocks[slow][r] for r in common], [blocks[fast][r] for r in common], confidence)


def resolve_tie(tied: Sequence[int], timings: Sequence[Timing], memory: Memory) -> tuple[int, str]:
    """The fixed rule for candidates equally fast: lower p95, then lower memory, then the first in order.

    Each step keeps the candidates within its margin of the best, so that noise does not flip the
    choice: a p95 counts as higher only when a bootstrap 95% interval of its ratio to the lowest
    lies wholly above ``1 + P95_MARGIN``, and only from ``P95_MIN_RUNS`` runs each. The rule named
    is the step that left one candidate.
    """
    left = sorted(tied)
    if all(len(timings[i].samples) >= P95_MIN_RUNS for i in left):
        best = min(left, key=lambda i: timings[i].p95_s)
        left = [i for i in left if i == best or _p95_ratio_low(timings[i], timings[best]) <= 1 + P95_MARGIN]
        if len(left) == 1:
            return left[0], "p95"
    known = {i: memory(i) for i in left}
    if all(m is not None for m in known.values()):
        best_mb = min(m for m in known.values() if m is not None)
        left = [i for i in left if (known[i] or 0.0) <= max(best_mb * (1 + MEMORY_MARGIN), best_mb + MEMORY_FLOOR_MB)]
        if len(left) == 1:
            return left[0], "memory"
    return left[0], "order"


def _p95_ratio_low(slow: Timing, fast: Timing) -> float:
    """Lower end of a bootstrap 95% interval of ``slow``'s p95 over ``fast``'s."""
    rng = np.random.default_rng(0)

    def resampled(samples: tuple[float, ...]) -> np.ndarray:
        runs = np.asarray(samples, np.float64)[-BOOTSTRAP_MAX_RUNS:]
        return np.percentile(runs[rng.integers(0, len(runs), (BOOTSTRAP, len(runs)))], 95, axis=1)

    return float(np.percentile(resampled(slow.samples) / resampled(fast.samples), 2.5))
