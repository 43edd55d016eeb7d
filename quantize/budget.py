"""The accuracy budget and the figures it judges: one score per output, one function that decides.

Agreement metrics (top-1, top-5, per-pixel class, confident detections, exact) are in points
(0..100) and may lose at most ``--max-drop`` points against the user's model; signal metrics
(SQNR, PSNR) are in dB and must reach ``--min-db``. ``Budget.share`` puts both on one scale, the
share of the budget an output uses (1.0 is the limit; for dB it is the RMS error over the RMS error
``--min-db`` allows), so the worst output is the one that uses the most. ``Budget.admits`` is the
only place that decides whether a variant is within budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["Accuracy", "Budget", "OutputScore"]

_SHARE_CAP = 1e6  # a zero budget makes any loss infinitely over it; JSON has no infinity


@dataclass(frozen=True)
class OutputScore:
    """One output's figure against the user's model on the same samples, and where it was worst."""

    output: str
    metric: str  # the metric's key, e.g. "top1", "sqnr"
    title: str  # as the report names it, e.g. "top-1 agreement"
    unit: str  # "points" or "dB"
    value: float
    reference: float  # points: the user's model's own figure (100, or its accuracy on labels); dB: the cap
    why: str = ""
    worst_sample: int = 0
    worst_value: float = 0.0  # the metric on the worst sample alone (same unit)
    detail: dict[str, float] = field(default_factory=dict)

    @property
    def drop(self) -> float | None:
        """Points lost against the user's model (None for dB metrics, which the budget reads as they are)."""
        return round(self.reference - self.value, 6) if self.unit == "points" else None

    def figure(self) -> str:
        """The figure as users read it, e.g. ``top-1 agreement 97.50`` or ``SQNR 34.2 dB``."""
        return f"{self.title} {self.value:.1f} dB" if self.unit == "dB" else f"{self.title} {self.value:.2f}"

    def to_dict(self) -> dict[str, object]:
        """JSON-ready figures."""
        return {"output": self.output, "metric": self.title, "key": self.metric, "unit": self.unit,
                "value": self.value, "reference": self.reference, "drop": self.drop, "why": self.why,
                "worst_sample": self.worst_sample, "worst_sample_value": self.worst_value, **self.detail}


@dataclass(frozen=True)
class Budget:
    """`--max-drop` points for agreement metrics, `--min-db` for SQNR/PSNR."""

    max_drop: float = 1.0
    min_db: float = 30.0

    def share(self, score: OutputScore) -> float:
        """How much of the budget `score` uses: <= 1.0 is within it."""
        if score.unit == "dB":
            return min(_SHARE_CAP, 10 ** ((self.min_db - score.value) / 20))
        drop = score.drop or 0.0
        if self.max_drop <= 0:
            return 0.0 if drop <= 0 else _SHARE_CAP
        return min(_SHARE_CAP, drop / self.max_drop)

    def admits(self, accuracy: Accuracy) -> bool:
        """True when every output of `accuracy` is within the budget: the one check every caller uses."""
        return all(self.share(s) <= 1.0 for s in accuracy.outputs)

    def limit(self, score: OutputScore) -> str:
        """The budget `score` is judged against, e.g. ``--min-db 30``."""
        return f"--min-db {self.min_db:g}" if score.unit == "dB" else f"--max-drop {self.max_drop:g}"

    def verdict(self, score: OutputScore) -> str:
        """E.g. ``boxes: SQNR 24.1 dB < --min-db 30`` or ``logits: top-1 agreement 97.50 (drop 2.50) <= --max-drop 3``."""
        ok = self.share(score) <= 1.0
        if score.unit == "dB":
            return f"{score.output}: {score.figure()} {'>=' if ok else '<'} {self.limit(score)}"
        return f"{score.output}: {score.figure()} (drop {score.drop:.2f}) {'<=' if ok else '>'} {self.limit(score)}"

    def to_dict(self) -> dict[str, float]:
        """JSON-ready."""
        return {"max_drop": self.max_drop, "min_db": self.min_db}


@dataclass(frozen=True)
class Accuracy:
    """Every output's score under one budget; the headline is the output that uses the most of it."""

    outputs: tuple[OutputScore, ...]
    budget: Budget

    @property
    def ok(self) -> bool:
        """Within budget on every output (Budget.admits)."""
        return self.budget.admits(self)

    @property
    def worst(self) -> OutputScore:
        """The output that uses the most of the budget (the first one on a tie)."""
        return max(self.outputs, key=self.budget.share)

    @property
    def share(self) -> float:
        """The worst output's share of the budget."""
        return self.budget.share(self.worst)

    def summary(self) -> str:
        """The worst output's verdict and its worst sample, for notes and errors."""
        worst = self.worst
        return f"{self.budget.verdict(worst)}, worst sample {worst.worst_sample}"

    def to_dict(self) -> dict[str, object]:
        """The worst output's figures at the top level, then one entry per output with its budget share."""
        worst = self.worst
        return {"worst_output": worst.output, "metric": worst.title, "unit": worst.unit, "value": worst.value,
                "drop": worst.drop, "worst_sample": worst.worst_sample, "worst_sample_value": worst.worst_value,
                "budget_share": _finite(self.share),
                "ok": self.ok, "outputs": [{**s.to_dict(), "budget_share": _finite(self.budget.share(s)),
                                            "ok": self.budget.share(s) <= 1.0} for s in self.outputs]}


def _finite(value: float) -> float:
    return round(value, 4) if math.isfinite(value) else _SHARE_CAP
