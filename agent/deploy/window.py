"""Installing only inside the maintenance window: the device's own clock decides, whatever the controller thought.

A desired state's entries may carry :class:`~edgecore.windows.Maintenance` (the windows of the
device's groups and the rollout's forced-update deadline). Before the worker deploys a unit it asks
:meth:`WindowGate.hold`: outside the window it reports a ``window``/``waiting`` event naming when
it will install (``window_opens_at``, which the controller's wave timeout counts from) and waits,
on the worker's thread, until the window opens, a newer desired set replaces the unit (the cancel
a halt sends included) or the agent stops. The job stays queued meanwhile, so after a power cut it
waits again. The units of a set go in the order their windows open (:meth:`WindowGate.in_order`), so
an entry that waits for its window (another rollout's, say) does not hold back one that may install
now. The device's own windows (agent.yaml ``maintenance_windows``, which the controller's
device configuration may set) count beside the desired state's, for every update. Windows are read
in the device's time zone (agent.yaml ``timezone``, else the system's); a device whose windows
never open together, with no deadline, refuses the unit.
"""

from __future__ import annotations

import enum
import math
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime, tzinfo
from typing import Any, Protocol

from agent.deploy.plan import Wanted
from edgecore.windows import Maintenance, Windows

__all__ = ["Hold", "WindowGate"]

POLL_S = 1.0  # how often a wait looks for a newer desired set


class Hold(enum.Enum):
    GO = "go"  # inside the window (or no window): deploy now
    STOPPING = "stopping"  # the agent stops: the job goes on after the restart
    SUPERSEDED = "superseded"  # a newer desired set waits: this unit gives way
    NEVER = "never"  # its windows never open together and nothing forces it


class Report(Protocol):
    def __call__(self, deployment_id: str, state: str, status: str, detail: str, data: dict[str, Any],
                 model: str | None = None) -> None: ...


class WindowGate:
    """When a unit may be deployed, by this device's clock and time zone."""

    def __init__(self, zone: tzinfo, clock: Callable[[], float] = time.time, poll_s: float = POLL_S,
                 own: Callable[[], Windows] = Windows) -> None:
        self.zone = zone
        self.clock = clock
        self.poll_s = poll_s
        self.own = own  # the device's own windows (agent.yaml or its configuration), read at each look

    def allowed_from(self, unit: Sequence[Wanted], now: float) -> float | None:
        """``now`` when every entry of the unit may install now, else the first time they may; None: never. The
        device's own windows count beside each entry's, and a desired state's deadline overrides both."""
        latest, own = now, self.own()
        for entry in unit:
            maintenance = entry.options.maintenance or Maintenance()
            if own:
                maintenance = Maintenance((*maintenance.schedules, own), maintenance.force_at)
            if not maintenance:
                continue
            allowed = maintenance.allowed_from(now, self.zone)
            if allowed is None:
                return None
            latest = max(latest, allowed)
        return latest

    def in_order(self, units: Sequence[tuple[Wanted, ...]]) -> list[tuple[Wanted, ...]]:
        """The units of a set by when their windows let them install, those that may now first and those that never
        may last (ties keep the plan's order): a unit that waits for its window does not hold back the others."""
        now = self.clock()

        def opens(unit: tuple[Wanted, ...]) -> float:
            at = self.allowed_from(unit, now)
            return math.inf if at is None else at

        return sorted(units, key=opens)

    def hold(self, unit: Sequence[Wanted], report: Report, stopping: threading.Event, newer: Callable[[], bool]) -> Hold:
        """Wait until the unit may install; each new opening time is reported once per entry."""
        told: float | None = None
        while True:
            now = self.clock()
            until = self.allowed_from(unit, now)
            if until is None:
                for entry in unit:
                    report(entry.deployment_id, "window", "failed", "its maintenance windows never open together "
                           "(in a week) and no forced-update deadline is set: not installed", {}, entry.name)
                return Hold.NEVER
            if until <= now:
                return Hold.GO
            if until != told:
                local = datetime.fromtimestamp(until, self.zone).strftime("%Y-%m-%d %H:%M %Z")
                for entry in unit:
                    report(entry.deployment_id, "window", "waiting",
                           f"outside its maintenance window: installs at {local} (device time)",
                           {"window_opens_at": until}, entry.name)
                told = until
            if stopping.wait(min(until - now, self.poll_s)):
                return Hold.STOPPING
            if newer():
                return Hold.SUPERSEDED
