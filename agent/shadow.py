"""Shadow run: the staged new model answers the same inputs as the serving one, before cut-over.

The inputs are the package's golden inputs, the most recent live requests the served model
answered (kept in memory only, see ``ModelRegistry``), and, when those are few, synthetic inputs
drawn like the golden ones. Every sample (a row of a batch) counts once. Two answers agree when a
classifier-like output (float, last axis > 1) picks the same top-1 class, and otherwise when the
values match within the dtype's golden tolerance.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from agent.backends import TensorSpec
from agent.deploy.golden import tolerance_for

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

    def to_dict(self) -> dict[str, Any]:
        return {"agreement": round(self.agreement, 4), "samples": self.samples, "live": self.live,
                "first_difference": self.first_difference}


def shadow_inputs(golden: Feeds, live: Iterable[Feeds], specs: list[TensorSpec], seed: int = 0) -> tuple[list[Feeds], int]:
    """(feeds to run, how many are live): golden first, then live, then synthetic up to MIN_SAMPLES."""
    feeds = [golden] if golden else []
    recent = [f for f in live if set(f) == {s.name for s in specs}]
    feeds += recent
    rng = np.random.default_rng(seed)
    while sum(_rows(f) for f in feeds) < MIN_SAMPLES:
        feeds.append(_synthetic(golden, specs, rng))
    return feeds, sum(_rows(f) for f in recent)


def measure_agreement(old: Infer, new: Infer, feeds: list[Feeds], live: int = 0) -> Agreement:
    """Run every feed through both models and count the samples whose answers agree."""
    agreed = total = 0
    first = ""
    for feed in feeds:
        ok, rows, why = _compare(old(feed), new(feed))
        total += rows
        agreed += ok
        first = first or why
    return Agreement(agreed / total if total else 0.0, total, live, first)


def _compare(old: Mapping[str, Any], new: Mapping[str, Any]) -> tuple[int, int, str]:
    """(samples that agree, samples, first difference) for one feed's outputs."""
    names = sorted(set(old) & set(new))
    if not names:
        return 0, 1, f"no common outputs (old: {sorted(old)}, new: {sorted(new)})"
    rows = None
    for name in names:
        a, b = np.asarray(old[name]), np.asarray(new[name])
        if a.shape != b.shape:
            return 0, max(1, a.shape[0] if a.ndim else 1), f"output {name!r}: shape {list(a.shape)} became {list(b.shape)}"
        same = _row_agreement(a, b)
        rows = same if rows is None else rows & same
    assert rows is not None
    why = "" if rows.all() else f"output(s) {', '.join(names)} differ on {int((~rows).sum())} of {rows.size} sample(s)"
    return int(rows.sum()), int(rows.size), why


def _row_agreement(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A boolean per sample (first axis; one sample for scalars)."""
    a2 = a.reshape(a.shape[0] if a.ndim > 1 else 1, -1)
    b2 = b.reshape(a2.shape)
    if a.dtype.kind == "f" and a.ndim >= 2 and a.shape[-1] > 1:
        top = a.reshape(-1, a.shape[-1]).argmax(-1) == b.reshape(-1, b.shape[-1]).argmax(-1)
        return top.reshape(a2.shape[0], -1).all(axis=1)
    if a.dtype.kind in "fc":
        rtol, atol = tolerance_for(a.dtype)
        return np.isclose(a2, b2, rtol=rtol, atol=atol).all(axis=1)
    return (a2 == b2).all(axis=1)


def _rows(feed: Feeds) -> int:
    first = next(iter(feed.values()), None)
    return int(first.shape[0]) if first is not None and first.ndim > 0 else 1


def _synthetic(golden: Feeds, specs: list[TensorSpec], rng: np.random.Generator) -> Feeds:
    """One input like the golden one (same shapes and dtypes), else like the model's signature."""
    template: dict[str, tuple[tuple[int, ...], np.dtype[Any]]] = (
        {k: (v.shape, v.dtype) for k, v in golden.items()} if golden else
        {s.name: (tuple(d if isinstance(d, int) and d > 0 else 1 for d in s.shape), _dtype(s.dtype)) for s in specs})
    feed = {}
    for name, (shape, dtype) in template.items():
        if dtype.kind == "f":
            feed[name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            feed[name] = rng.integers(0, 2, shape).astype(bool)
        else:
            feed[name] = rng.integers(0, 10, shape).astype(dtype)
    return feed


def _dtype(name: str | None) -> np.dtype[Any]:
    try:
        dtype = np.dtype(name or "float32")
    except TypeError:
        return np.dtype("float32")
    return dtype if dtype.kind != "O" else np.dtype("float32")
