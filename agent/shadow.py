"""Shadow run: the staged new model answers the same inputs as the serving one, before cut-over.

The inputs are the package's golden inputs, the most recent live requests the served model
answered (kept in memory only, see ``ModelRegistry``), and, when those are few, synthetic inputs
shaped like the golden ones (``edgecore.tensors``). Every sample (a row of a batch) counts once. Two
answers agree when a classifier-like output (float, last axis > 1) picks the same top-1 class, and
otherwise when the values match within the new model's precision tolerance (``edgecore.tensors``,
the policy backend selection uses too).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgecore.backends import TensorSpec
from edgecore.tensors import agreeing_rows, synthetic_feeds

__all__ = ["Agreement", "Feeds", "measure_agreement", "shadow_inputs"]

Feeds = dict[str, np.ndarray]
Infer = Callable[[Feeds], Mapping[str, Any]]

MIN_SAMPLES = 16  # below this many golden + live samples, synthetic ones fill up


@dataclass(frozen=True)
class Agreement:
    agreement: float  # fraction of samples on which old and new agree
    samples: int
    live: int  # of which came from live requests
    first_difference: str  # "" when all agree
    backend: str = ""  # the backend the new side ran on, when the caller says

    def to_dict(self) -> dict[str, Any]:
        data = {"agreement": round(self.agreement, 4), "samples": self.samples, "live": self.live,
                "first_difference": self.first_difference}
        return data | ({"backend": self.backend} if self.backend else {})


def shadow_inputs(golden: Feeds, live: Iterable[Feeds], specs: list[TensorSpec], seed: int = 0) -> tuple[list[Feeds], int]:
    """(feeds to run, how many are live): golden first, then live, then synthetic up to MIN_SAMPLES."""
    feeds = [golden] if golden else []
    recent = [f for f in live if set(f) == {s.name for s in specs}]
    feeds += recent
    rng = np.random.default_rng(seed)
    while sum(_rows(f) for f in feeds) < MIN_SAMPLES:
        feeds.append(synthetic_feeds(specs, rng, like=golden))
    return feeds, sum(_rows(f) for f in recent)


def measure_agreement(old: Infer, new: Infer, feeds: list[Feeds], live: int = 0, precision: str = "fp32") -> Agreement:
    """Run every feed through both models and count the samples whose answers agree.

    ``precision`` is the new model's (``edgecore.tensors.model_precision``): it sets the tolerance.
    """
    agreed = total = 0
    first = ""
    for feed in feeds:
        ok, rows, why = _compare(old(feed), new(feed), precision)
        total += rows
        agreed += ok
        first = first or why
    return Agreement(agreed / total if total else 0.0, total, live, first)


def _compare(old: Mapping[str, Any], new: Mapping[str, Any], precision: str) -> tuple[int, int, str]:
    """(samples that agree, samples, first difference) for one feed's outputs."""
    names = sorted(set(old) & set(new))
    if not names:
        return 0, 1, f"no common outputs (old: {sorted(old)}, new: {sorted(new)})"
    rows = None
    for name in names:
        a, b = np.asarray(old[name]), np.asarray(new[name])
        if a.shape != b.shape:
            return 0, max(1, a.shape[0] if a.ndim else 1), f"output {name!r}: shape {list(a.shape)} became {list(b.shape)}"
        same = agreeing_rows(a, b, precision)
        rows = same if rows is None else rows & same
    assert rows is not None
    why = "" if rows.all() else f"output(s) {', '.join(names)} differ on {int((~rows).sum())} of {rows.size} sample(s)"
    return int(rows.sum()), int(rows.size), why


def _rows(feed: Feeds) -> int:
    first = next(iter(feed.values()), None)
    return int(first.shape[0]) if first is not None and first.ndim > 0 else 1
