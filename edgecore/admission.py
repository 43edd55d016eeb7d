"""The admission rule a device applies to a desired set: the costs of what it would serve against its memory budget.

One rule and one refusal (its event's detail and numbers) for the agent (``agent.admission``, which
knows how each cost is measured) and the simulated devices of ``edgectl sim`` (``edgectl.sim_sets``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["Cost", "Refusal", "admit"]


@dataclass(frozen=True)
class Cost:
    """What one model or pipeline counts, and how that figure is known."""

    name: str
    mb: float
    how: str  # "on onnxruntime/CPUExecutionProvider", "measured at staging on ...", "its files' size, not measured yet"

    def describe(self) -> str:
        return f"{self.name} {self.mb:.0f} {self.how}"


@dataclass(frozen=True)
class Refusal:
    """A set that does not fit: the numbers an event names."""

    needed_mb: float
    budget_mb: float
    costs: tuple[Cost, ...]

    def detail(self) -> str:
        parts = ", ".join(c.describe() for c in sorted(self.costs, key=lambda c: -c.mb))
        return f"the set needs {self.needed_mb:.0f} MB ({parts}) and the budget is {self.budget_mb:.0f} MB"

    def data(self) -> dict[str, Any]:
        # Kilobyte precision: a small model's share must not read as 0 MB in the numbers a controller compares.
        return {"budget_mb": round(self.budget_mb, 3), "needed_mb": round(self.needed_mb, 3),
                "models": {c.name: round(c.mb, 3) for c in self.costs}}


def admit(costs: Iterable[Cost], budget_mb: float | None) -> Refusal | None:
    """None when the costs fit the budget (or no budget is known); else the refusal with its numbers."""
    costs = tuple(costs)
    needed = sum(c.mb for c in costs)
    if budget_mb is None or needed <= budget_mb:
        return None
    return Refusal(needed, budget_mb, costs)
