"""Admission: a desired set is taken only if the footprints of everything it would serve fit the device's budget.

Each model's cost is the resident memory measured on this device (``agent.footprint``): on the
backend serving it when that is known, else the most any backend took when it was measured (staging
measures the reference device), else, for a model never measured here, the size of its files (its
weights must be in memory: a lower bound). The device checks a set before it touches anything, and
a unit again once staging measured its new models, before they are activated.

The budget is ``models.memory_budget_mb``, by default the lower of physical memory and the memory
cgroup's limit (``edgecore.memory_limit``, the reader the address-space cap uses too).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from agent.deploy.plan import Wanted
from agent.footprint import FootprintBook, footprint_key
from edgecore.admission import Cost, Refusal, admit
from edgecore.memory_limit import CGROUP_ROOT, PROC_ROOT, cgroup_memory, physical_memory
from edgecore.protocol.manifest import Manifest

__all__ = ["Admission", "cost_of", "default_budget_mb"]

MB = 2**20


def default_budget_mb(cgroup_root: Path = CGROUP_ROOT, proc_root: Path = PROC_ROOT) -> float | None:
    """The lower of physical memory and the memory cgroup's limit, in MiB (None when neither can be read)."""
    limits = [physical_memory(proc_root)]
    cgroup = cgroup_memory(cgroup_root, proc_root)
    limits.append(cgroup.limit if cgroup is not None else None)
    known = [limit for limit in limits if limit is not None]
    return min(known) / MB if known else None


def cost_of(manifest: Manifest, book: FootprintBook, serving_backend: str | None = None) -> Cost:
    """What ``manifest``'s model (or pipeline) counts against the budget, from what this device measured."""
    figures = book.get(footprint_key(manifest))
    if serving_backend is not None and serving_backend in figures:
        return Cost(manifest.name, figures[serving_backend], f"on {serving_backend}")
    if figures:
        backend = max(figures, key=lambda b: figures[b])
        return Cost(manifest.name, figures[backend], f"measured at staging on {backend}")
    size = sum(f.size for f in manifest.files if f.role in ("model", "graph", "partition")) / MB
    return Cost(manifest.name, size, "its files' size, not measured yet")


class Admission:
    """This device's admission: its budget, its measured footprints, and what serves now under each name.

    ``serving()`` gives, per name served, the sha256 of its signed manifest and its backend: an
    entry of a set that the device already serves counts its figure on that backend."""

    def __init__(self, book: FootprintBook, budget_mb: float | None,
                 serving: Callable[[], Mapping[str, tuple[str, str]]]) -> None:
        self.book = book
        self.budget_mb = budget_mb
        self.serving = serving

    def costs(self, wanted: Sequence[Wanted]) -> list[Cost]:
        serving = self.serving()
        costs = []
        for entry in wanted:
            now = serving.get(entry.name)
            backend = now[1] if now is not None and now[0] == entry.sha256 else None
            costs.append(cost_of(entry.manifest, self.book, backend))
        return costs

    def check(self, wanted: Sequence[Wanted]) -> Refusal | None:
        """Why the set ``wanted`` does not fit, or None."""
        return admit(self.costs(wanted), self.budget_mb)
