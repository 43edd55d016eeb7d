"""Re-measuring the serving models' backends when the device is idle, and switching only on evidence.

A pick made while the device was busy (a deployment at a busy hour, a noisy neighbour) may be
wrong, and a pick the contest could not settle within its budget (rule ``estimate``) is a guess by
design. When the device is idle, ``IdleRemeasure.tick`` measures the serving model's candidates
again and switches the serving backend only when another one is faster beyond the noise (rule
``faster``) *and* answers the golden and latest live inputs as the serving one does (the shadow
path, ``ModelHost.switch``); a tie, an estimate or a disagreement keeps what serves.

When: a pick is due ``every_s`` after it was measured, or ``idle_s`` after it when it was made by
the estimate; the device must be idle (``Idleness``). With several models, the one most overdue goes
first, one per idle moment. Bounded: the measurement runs in a child
process at the lowest priority (``NICE``), so it takes only CPU time nothing else wants; its
contest stops at ``budget_s``; it is stopped (and the child killed) the moment a request or a job
arrives; a stopped attempt is retried after ``idle_s``, doubling up to ``every_s``. It runs on the
model worker thread between jobs, so it never races a deployment.

Every attempt is reported (``Remeasured``: the daemon sends it as a ``remeasure`` event and keeps
the last one in telemetry), with the decision, the shadow agreement and the CPU time it used.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from agent.config import RemeasureSettings
from agent.measure_child import Stopped
from agent.model_host import LoadedModel, ModelHost
from agent.selection import Selection
from agent.serving import ModelRegistry
from edgecore.errors import ConfigError, EdgeError, NotFoundError, one_line

__all__ = ["NICE", "DeviceActivity", "IdleRemeasure", "Idleness", "Remeasured", "why_keep"]

log = logging.getLogger(__name__)

NICE = 19  # the measuring child's priority: the lowest


class Idleness(Protocol):
    """The idle signal: whether a re-measure may start, and whether one running may go on."""

    def idle(self) -> bool:
        """Whether the device has been idle long enough to start."""

    def quiet(self) -> bool:
        """Whether nothing arrived (a request, a job) that a running re-measure must give way to."""


class DeviceActivity:
    """The daemon's idle signal: no inference request (none in flight either) and no job for ``idle_s``, and the
    1-minute load average per core at most ``max_load`` (the load is asked only to start: a measurement raises it)."""

    def __init__(self, registry: ModelRegistry, jobs_waiting: Callable[[], bool], settings: RemeasureSettings,
                 clock: Callable[[], float] = time.monotonic,
                 load: Callable[[], float] = lambda: os.getloadavg()[0] / (os.cpu_count() or 1)) -> None:
        self.registry = registry
        self.jobs_waiting = jobs_waiting
        self.settings = settings
        self.clock = clock
        self.load = load
        self._seen = -1  # requests counted and in flight, the last time this looked
        self._since = clock()  # ... and since when that figure holds

    def _activity(self) -> int:
        total = 0
        for name in self.registry.names():
            with contextlib.suppress(NotFoundError):  # unpublished meanwhile (the agent stopping)
                entry = self.registry.get(name)
                total += entry.stats.requests + entry.inflight
        return total

    def quiet(self) -> bool:
        seen = self._activity()
        if seen != self._seen or self.jobs_waiting():
            self._seen, self._since = seen, self.clock()
            return False
        return True

    def idle(self) -> bool:
        return self.quiet() and self.clock() - self._since >= self.settings.idle_s and self.load() <= self.settings.max_load


@dataclass(frozen=True)
class Remeasured:
    """One background re-measurement: ``switched``, ``kept`` (and why), ``stopped`` or ``failed``."""

    outcome: str
    detail: str
    model: str
    version: int
    backend: str  # serving after it
    previous: str  # serving before it
    at: float
    cpu_s: float  # CPU seconds the measuring child used
    selection: dict[str, Any] | None = None  # the new measurement, when it ended
    agreement: dict[str, Any] | None = None  # the shadow run, when one ran

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: the event's data and the telemetry's ``remeasure``."""
        data = {"outcome": self.outcome, "detail": self.detail, "model": self.model, "version": self.version,
                "backend": self.backend, "previous": self.previous, "at": self.at, "cpu_s": round(self.cpu_s, 3)}
        return data | {k: v for k, v in (("selection", self.selection), ("agreement", self.agreement)) if v is not None}


class IdleRemeasure:
    """Calls to ``tick`` (the model worker's idle moments) re-measure the serving model when due and idle."""

    def __init__(self, host: ModelHost, settings: RemeasureSettings, idleness: Idleness,
                 report: Callable[[Remeasured], None], clock: Callable[[], float] = time.time) -> None:
        _check(settings)
        self.host = host
        self.settings = settings
        self.idleness = idleness
        self.report = report
        self.clock = clock  # wall time, as Selection.measured_at
        self.last: Remeasured | None = None
        self._done: dict[str, float] = {}  # model sha256 -> when its last attempt ended
        self._retry_at = 0.0
        self._stops = 0

    def due_at(self, loaded: LoadedModel) -> float:
        """When the serving pick should be measured again (infinity: never)."""
        if self.settings.every_s <= 0:
            return math.inf
        selection = loaded.selection
        settled = selection.decision is None or selection.decision.rule != "estimate"
        measured = selection.measured_at
        if selection.model_sha256 in self._done:
            # Measured again since: wait the full period.
            measured, settled = max(measured, self._done[selection.model_sha256]), True
        return max(measured + (self.settings.every_s if settled else self.settings.idle_s), self._retry_at)

    def tick(self) -> Remeasured | None:
        """Re-measure now the most overdue serving model if its pick is due and the device is idle; None when nothing ran."""
        models = list(self.host.served().values())
        loaded = min((m for m in models if isinstance(m, LoadedModel)), key=self.due_at, default=None)
        if loaded is None or self.clock() < self.due_at(loaded) or not self.idleness.idle():
            return None
        result = self._remeasure(loaded)
        self.last = result
        self.report(result)
        return result

    def _remeasure(self, loaded: LoadedModel) -> Remeasured:
        before = _children_cpu_s()
        previous = loaded.selection.backend

        def ended(outcome: str, detail: str, **extra: Any) -> Remeasured:
            now = self.host.loaded(loaded.active.name)
            backend = now.selection.backend if now else previous
            return Remeasured(outcome, detail, loaded.active.name, loaded.active.version, backend, previous,
                              self.clock(), _children_cpu_s() - before, **extra)

        try:
            selection = self.host.remeasure(loaded, self.settings.budget_s, self.idleness.quiet, NICE)
        except Stopped:
            self._stops += 1
            self._retry_at = self.clock() + min(self.settings.idle_s * 2 ** self._stops, self.settings.every_s)
            return ended("stopped", "a request or a job arrived: stopped, to be measured at the next idle moment")
        except EdgeError as exc:
            self._finish(loaded)
            return ended("failed", one_line(exc))
        self._finish(loaded)
        found = selection.to_dict()
        keep = why_keep(loaded.selection, selection)
        if keep is not None:
            return ended("kept", keep, selection=found)
        try:
            switched, agreement = self.host.switch(loaded, selection, self.settings.min_agreement)
        except Exception as exc:  # the new backend failing on live inputs is its failure; the old one keeps serving
            return ended("kept", f"{selection.backend} failed beside {previous}: {one_line(exc)}", selection=found)
        if not switched:
            return ended("kept", f"{selection.backend} is faster but agrees with {previous} on {agreement.agreement:.1%}"
                                 f" of {agreement.samples} shadow samples, {self.settings.min_agreement:.1%} needed "
                                 f"({agreement.first_difference})", selection=found, agreement=agreement.to_dict())
        return ended("switched", f"{selection.backend}: {_describe(selection)}", selection=found,
                     agreement=agreement.to_dict())

    def _finish(self, loaded: LoadedModel) -> None:
        serving = {m.selection.model_sha256 for m in self.host.served().values() if isinstance(m, LoadedModel)}
        self._done = {sha: at for sha, at in self._done.items() if sha in serving}  # bounded by the models served
        self._done[loaded.selection.model_sha256] = self.clock()
        self._stops, self._retry_at = 0, 0.0


def why_keep(serving: Selection, found: Selection) -> str | None:
    """Why a new measurement must not move serving off ``serving``'s backend; None when it may (pure).

    Only a winner faster beyond the noise than every other candidate moves it: a tie, or a pick by
    the estimate, would flip the serving backend on noise."""
    if found.candidate == serving.candidate:
        return f"{serving.backend} is still the pick: {_describe(found)}"
    if found.decision is None or found.decision.rule != "faster":
        return f"no backend is faster beyond the noise than {serving.backend}: {_describe(found)}"
    return None


def _describe(selection: Selection) -> str:
    return selection.decision.describe() if selection.decision else "no decision recorded"


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _check(settings: RemeasureSettings) -> None:
    problems = [
        (settings.every_s < 0, "remeasure.every_s must be 0 (off) or more"),
        (settings.idle_s < 0, "remeasure.idle_s must be 0 or more"),
        (settings.budget_s <= 0, "remeasure.budget_s must be more than 0"),
        (not 0 < settings.min_agreement <= 1, "remeasure.min_agreement must be more than 0 and at most 1"),
        (settings.max_load < 0, "remeasure.max_load must be 0 or more"),
    ]
    for bad, message in problems:
        if bad:
            raise ConfigError(message)
