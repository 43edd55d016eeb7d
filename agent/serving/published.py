"""The models being served: atomic swaps, and runners closed only after in-flight requests end.

A pipeline holds the entries of the models its steps run (:meth:`ModelRegistry.hold`): a model
swapped or unpublished meanwhile keeps its runner open for that pipeline until the pipeline itself
is retired and :meth:`ModelRegistry.release` lets it go, so one request through a pipeline never
runs two versions of its models.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agent.telemetry import ModelStats
from edgecore.backends.base import Runner, TensorSpec
from edgecore.errors import NotFoundError

__all__ = ["ModelRegistry", "PublishedModel"]

log = logging.getLogger(__name__)

RECENT_INPUTS = 16
RECENT_INPUT_MAX_BYTES = 2 * 1024 * 1024  # larger requests are not kept


@dataclass
class PublishedModel:
    """One model version behind a name; its metadata is read once at publish time."""

    name: str
    version: str
    runner: Runner
    info: dict[str, Any]
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    placement: dict[str, Any]
    stats: ModelStats = field(default_factory=ModelStats)
    # The latest requests' inputs, in memory only: a shadow run replays them on a candidate model.
    recent: deque[dict[str, np.ndarray]] = field(default_factory=lambda: deque(maxlen=RECENT_INPUTS))
    inflight: int = 0  # requests holding it, and pipelines that run it
    retired: bool = False
    closed: bool = False
    drained: threading.Event = field(default_factory=threading.Event)  # set once its runner is closed


class ModelRegistry:
    """Name -> published model, safe for concurrent requests and swaps.

    ``publish`` activates the runner if it is not active yet, then swaps it in atomically. The
    previous runner is retired: requests that already hold it finish on it, and the last one out
    closes it; new requests see the new runner.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._models: dict[str, PublishedModel] = {}

    def publish(self, name: str, version: str, runner: Runner, info: dict[str, Any] | None = None) -> None:
        """Serve ``runner`` as ``name``/``version``, replacing (and later closing) the old one."""
        if not runner.is_active:
            runner.activate()
        entry = PublishedModel(
            name=name,
            version=str(version),
            runner=runner,
            info=dict(info or {}),
            inputs=runner.inputs,
            outputs=runner.outputs,
            placement=_placement_dict(runner.placement),
        )
        with self._lock:
            old = self._models.get(name)
            self._models[name] = entry
        if old is not None and old.runner is not runner:
            self._retire(old)
        log.info("serving %s version %s on %s", name, version, runner.name)

    def unpublish(self, name: str) -> PublishedModel:
        """Stop serving ``name``; its runner closes when its in-flight requests end (``drained`` is set then)."""
        with self._lock:
            old = self._models.pop(name, None)
        if old is None:
            raise NotFoundError(f"model '{name}' is not published")
        self._retire(old)
        return old

    def hold(self, name: str) -> PublishedModel:
        """The current entry of ``name``, kept open until :meth:`release` (a pipeline runs it)."""
        with self._lock:
            entry = self._models.get(name)
            if entry is not None:
                entry.inflight += 1
        if entry is None:
            raise NotFoundError(f"model '{name}' is not published (published: {self.names()})")
        return entry

    def release(self, entry: PublishedModel) -> None:
        """Let go of a held entry; a retired one closes when nothing holds it any more."""
        with self._lock:
            entry.inflight -= 1
            close = entry.retired and entry.inflight == 0 and not entry.closed
            if close:
                entry.closed = True
        if close:
            _close(entry)

    def names(self) -> list[str]:
        """Published model names, sorted."""
        with self._lock:
            return sorted(self._models)

    def get(self, name: str) -> PublishedModel:
        """The current entry for metadata (no reference is held)."""
        with self._lock:
            entry = self._models.get(name)
        if entry is None:
            raise NotFoundError(f"model '{name}' is not published (published: {self.names()})")
        return entry

    @contextmanager
    def acquire(self, name: str) -> Iterator[PublishedModel]:
        """Hold the current entry for one request; a swap meanwhile does not close its runner."""
        with self._lock:
            entry = self._models.get(name)
            if entry is not None:
                entry.inflight += 1
        if entry is None:
            raise NotFoundError(f"model '{name}' is not published (published: {self.names()})")
        try:
            yield entry
        finally:
            self.release(entry)

    def remember_inputs(self, entry: PublishedModel, feeds: dict[str, np.ndarray]) -> None:
        """Keep a served request's inputs for shadow runs (bounded in count and size)."""
        if sum(np.asarray(v).nbytes for v in feeds.values()) <= RECENT_INPUT_MAX_BYTES:
            with self._lock:
                entry.recent.append(feeds)

    def recent_inputs(self, name: str) -> list[dict[str, np.ndarray]]:
        """The latest inputs ``name`` answered, oldest first; empty when it is not published."""
        with self._lock:
            entry = self._models.get(name)
            return list(entry.recent) if entry is not None else []

    def index(self) -> list[dict[str, Any]]:
        """What is served, as the model repository extension lists it: name, version, state, and its backend and kind."""
        with self._lock:
            entries = sorted(self._models.values(), key=lambda e: e.name)
        return [{"name": e.name, "version": e.version, "state": "READY", "backend": e.runner.name,
                 "kind": str(e.info.get("kind", "model"))} for e in entries]

    def telemetry(self) -> dict[str, dict[str, Any]]:
        """Per model: version, backend, placement, counters, latency percentiles, throughput."""
        with self._lock:
            entries = list(self._models.values())
        return {
            e.name: {
                "version": e.version,
                "backend": e.runner.name,
                "placement": e.placement,
                **e.stats.snapshot(),
                "info": e.info,
            }
            for e in entries
        }

    def close(self) -> None:
        """Unpublish everything (runners close as their requests end)."""
        for name in self.names():
            with contextlib.suppress(NotFoundError):  # unpublished concurrently: already retired
                self.unpublish(name)

    def _retire(self, entry: PublishedModel) -> None:
        with self._lock:
            entry.retired = True
            close = entry.inflight == 0 and not entry.closed
            if close:
                entry.closed = True
        if close:
            _close(entry)


def _placement_dict(placement: Any) -> dict[str, Any]:
    """A runner's placement report as a plain dict (backends report a ``Placement`` or a dict)."""
    to_dict = getattr(placement, "to_dict", None)
    return dict(to_dict()) if callable(to_dict) else dict(placement)


def _close(entry: PublishedModel) -> None:
    """Close a retired runner; never raise, a failed close must not fail a request."""
    try:
        entry.runner.close()
        log.info("closed %s version %s (%s)", entry.name, entry.version, entry.runner.name)
    except Exception:
        log.exception("closing %s version %s failed", entry.name, entry.version)
    finally:
        entry.drained.set()
