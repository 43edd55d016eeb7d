"""The crash-loop guard: a model that kills or hangs the serving process K times in a window is rolled back.

Staging runs every new model once in a limited child first (``agent.deploy.stage``), but the
serving process still runs it itself: loading it on the chosen backend, measuring the candidates,
after every restart. Before such a run the guard writes, durably, which model is about to run
(*armed*); the end of the run disarms it. If the process dies meanwhile (the OOM killer, a segfault
in a runtime, a supervisor's watchdog), the next start finds the guard armed and counts a death for
that model. A run that outlasts its deadline counts as a death too, and the process ends itself
(its supervisor restarts it): a thread stuck in native code cannot be stopped any other way.

At start, before anything loads the active models, :meth:`CrashLoopGuard.admit` rolls each model
back to its previous version once the active one has died ``max_deaths`` times within ``window_s``
(the others are untouched); the agent reports that as a rollback event. Without this a model that
kills the agent on load is loaded first again on every restart, forever.

The event carries the id of the deployment that installed the model, so that a rollout can link
it: the run that ACTIVATE guards names its deployment, and the record keeps that id per model
(``installs``, the most recent :data:`MAX_INSTALLS` models) for the runs after later restarts.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.deploy.slots import ActiveModel, Slots
from edgecore.durable import atomic_write_json, read_json
from edgecore.protocol.messages import MAX_SET_MODELS, MAX_SET_PIPELINES

__all__ = ["EXIT_HUNG", "MAX_INSTALLS", "CrashLoopGuard", "GuardPolicy", "Verdict"]

log = logging.getLogger(__name__)

EXIT_HUNG = 75  # the process ends itself after a model run outlasts its deadline (EX_TEMPFAIL: restart me)
_SCHEMA = 1  # "installs" was added later: a record without it reads as one that knows no deployment
# Models whose deployment id the record keeps: both slots of every name a set may hold.
MAX_INSTALLS = 2 * (MAX_SET_MODELS + MAX_SET_PIPELINES)


@dataclass(frozen=True)
class GuardPolicy:
    """K deaths within the window roll a model back; a guarded run longer than ``run_timeout_s`` is a death."""

    max_deaths: int = 3
    window_s: float = 3600.0
    run_timeout_s: float = 600.0


@dataclass(frozen=True)
class Verdict:
    """What :meth:`CrashLoopGuard.admit` did at start: the model it rolled back from, and the one now active."""

    rolled_back: ActiveModel
    active: ActiveModel | None
    deaths: int
    window_s: float
    deployment_id: str | None = None  # the deployment that installed ``rolled_back``, when the record knows it

    def detail(self) -> str:
        now = f"{self.active.name} v{self.active.version}" if self.active else "no model"
        return (f"crash loop: {self.rolled_back.name} v{self.rolled_back.version} killed or hung the agent "
                f"{self.deaths} times within {self.window_s:g}s; rolled back to {now}")


def _exit_hung(what: str) -> None:
    log.critical("%s did not finish in time: ending the agent so that its supervisor restarts it", what)
    logging.shutdown()
    os._exit(EXIT_HUNG)


class CrashLoopGuard:
    """Counts the deaths of the serving process per model (manifest sha256) in ``<state>/guard.json``."""

    def __init__(self, state_dir: Path, policy: GuardPolicy, clock: Callable[[], float] = time.time,
                 on_hang: Callable[[str], None] = _exit_hung) -> None:
        self.path = state_dir / "guard.json"
        self.policy = policy
        self.clock = clock
        self.on_hang = on_hang  # seam: tests observe a hang instead of ending their own process
        self._lock = threading.Lock()

    # -- the record ---------------------------------------------------------------------------------

    def _read(self) -> dict[str, Any]:
        raw = read_json(self.path)
        if not isinstance(raw, dict) or raw.get("schema") != _SCHEMA:
            return {"schema": _SCHEMA, "armed": None, "deaths": {}, "installs": {}}
        deaths = raw.get("deaths")
        raw["deaths"] = {str(k): [float(t) for t in v] for k, v in deaths.items()} if isinstance(deaths, dict) else {}
        installs = raw.get("installs")
        raw["installs"] = {str(k): str(v) for k, v in installs.items()} if isinstance(installs, dict) else {}
        return raw

    def _write(self, record: dict[str, Any]) -> None:
        atomic_write_json(self.path, record)

    def _count_death(self, record: dict[str, Any], sha: str) -> None:
        """Add a death for ``sha``; forget deaths older than the window (so the record stays bounded)."""
        horizon = self.clock() - self.policy.window_s
        record["deaths"][sha] = [*record["deaths"].get(sha, []), self.clock()]
        kept = {k: [t for t in v if t >= horizon] for k, v in record["deaths"].items()}
        record["deaths"] = {k: v for k, v in kept.items() if v}
        record["armed"] = None

    # -- start ---------------------------------------------------------------------------------------

    def recover(self) -> str | None:
        """At start: a run still armed means the process died in it; count it. Returns that model's sha256."""
        with self._lock:
            record = self._read()
            armed = record.get("armed")
            if not isinstance(armed, dict) or "sha" not in armed:
                return None
            sha = str(armed["sha"])
            self._count_death(record, sha)
            self._write(record)
        log.error("the agent died while running %s: %d death(s) within %gs", armed.get("what", sha[:12]),
                  self.deaths(sha), self.policy.window_s)
        return sha

    def deaths(self, sha: str) -> int:
        """Deaths of the process while running this model, within the window."""
        horizon = self.clock() - self.policy.window_s
        return sum(1 for t in self._read()["deaths"].get(sha, []) if t >= horizon)

    def deployment_of(self, sha: str) -> str | None:
        """The id of the deployment that installed this model, when a guarded run recorded it."""
        installs: dict[str, str] = self._read()["installs"]
        return installs.get(sha)

    def tripped(self, sha: str) -> bool:
        return self.deaths(sha) >= self.policy.max_deaths

    def admit(self, slots: Slots) -> list[Verdict]:
        """Count a death left by the last run, then roll back each active model that has died too often.

        Only the model that killed the agent is rolled back; the others load as before."""
        self.recover()
        verdicts = []
        for name, active in sorted(slots.actives().items()):
            if not self.tripped(active.manifest_sha256):
                continue
            now = slots.roll_back(name)[name]
            sha = active.manifest_sha256
            verdict = Verdict(active, now, self.deaths(sha), self.policy.window_s, self.deployment_of(sha))
            log.error("%s", verdict.detail())
            verdicts.append(verdict)
        return verdicts

    # -- guarded runs --------------------------------------------------------------------------------

    @contextmanager
    def watch(self, model: ActiveModel, deployment_id: str | None = None) -> Iterator[None]:
        """Arm the guard (durably) for a run of ``model`` in this process; disarm when it ends, whatever the outcome.

        ``deployment_id``: the deployment installing ``model`` (ACTIVATE knows it); recorded for this
        and every later run of the model, so that a crash-loop rollback names it.
        """
        what = f"{model.name} v{model.version}"
        sha = model.manifest_sha256
        with self._lock:
            record = self._read()
            installs = record["installs"]
            if deployment_id:
                installs.pop(sha, None)  # re-inserted last: the oldest entries are the ones dropped
                installs[sha] = deployment_id
                record["installs"] = dict(list(installs.items())[-MAX_INSTALLS:])
            record["armed"] = {"sha": sha, "what": what, "since": self.clock(), "deployment_id": installs.get(sha)}
            self._write(record)
        timer = threading.Timer(self.policy.run_timeout_s, self._hung, (model.manifest_sha256, what))
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
            self.stand_down()

    def _hung(self, sha: str, what: str) -> None:
        with self._lock:
            record = self._read()
            self._count_death(record, sha)
            self._write(record)
        self.on_hang(f"running {what}")

    def stand_down(self) -> None:
        """Disarm: the run ended, or the agent stops on purpose (a stop is not the model's doing)."""
        with self._lock:
            record = self._read()
            if record.get("armed") is not None:
                record["armed"] = None
                self._write(record)
