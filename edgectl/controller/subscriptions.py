"""What the controller subscribes to, and a watch on the subscription that promises a steady flow: telemetry.

Replicas share telemetry (the volume) on an MQTT 5 shared subscription, ``$share/<group>/...``,
only where the broker says it honours one: MQTT 5 was negotiated and the CONNACK did not say
``Shared Subscription Available = 0``. MQTT 3.1.1 has no shared subscriptions (NATS, for one,
takes a ``$share/`` filter and delivers nothing to it), so there every replica subscribes to all
telemetry and ingests every report; the store keeps each report's history point once (ingest.py). Births,
presence and states are retained, which a shared subscription never receives, and events must
reach every replica: those are always plain subscriptions.

:class:`TelemetryWatch` says when telemetry stops where it should flow: no replica stored a report
for ``window_s`` while the store lists devices online (a broker that drops a shared subscription's
messages, an ACL that denies reading them). The service logs it, shows it in its health and, for a
shared subscription, falls back to a plain one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from edgecore.protocol import topics
from edgecore.transport import Transport
from edgectl.controller.health import ControllerHealth

__all__ = ["PLAIN_LEAVES", "TelemetrySubscription", "TelemetryWatch", "telemetry_filter"]

log = logging.getLogger(__name__)

PLAIN_LEAVES = ("birth", "presence", "state", "events", "logs")


def telemetry_filter(share_group: str, replicated: bool, shared_available: bool) -> str:
    """The telemetry subscription: shared among replicas where the broker honours that, else plain."""
    topic = topics.device("+", "telemetry")
    return f"$share/{share_group}/{topic}" if share_group and replicated and shared_available else topic


class TelemetryWatch:
    """Whether telemetry reaches the store while devices are online; ``seen()`` at each report this replica receives."""

    def __init__(self, window_s: float, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.window_s, self.monotonic = window_s, monotonic
        self._last = monotonic()  # a new subscription gets a window before it is judged

    def seen(self) -> None:
        self._last = self.monotonic()

    def restart(self) -> None:
        """A new subscription: judged a window from now."""
        self._last = self.monotonic()

    def problem(self, summary: Callable[[], tuple[int, float | None]], store_now: float) -> str | None:
        """What is wrong, or None. ``summary()``: (devices online, when the newest telemetry was stored)."""
        if self.monotonic() - self._last < self.window_s:
            return None
        online, newest = summary()
        if online == 0 or (newest is not None and store_now - newest < self.window_s):
            return None  # nothing promised, or another replica of the group receives it
        return (f"no telemetry for {self.window_s:.0f}s while {online} device(s) are online "
                "(a shared subscription the broker does not honour, or an ACL that denies reading telemetry?)")


class TelemetrySubscription:
    """The controller's telemetry subscription and its watch; problems go to the log and the health."""

    def __init__(self, transport: Transport, share_group: str, window_s: float, health: ControllerHealth) -> None:
        self.transport, self.share_group, self.health = transport, share_group, health
        self.watch = TelemetryWatch(window_s)
        self.filter = ""

    def subscribe(self, replicated: bool) -> None:
        """After connecting, once the broker said what it honours (``shared_subscriptions``: MqttTransport's)."""
        shared: bool = getattr(self.transport, "shared_subscriptions", False)
        self.filter = telemetry_filter(self.share_group, replicated, shared)
        self.transport.subscribe(self.filter, 1)
        self.watch.restart()
        log.info("telemetry on %s", self.filter)

    def check(self, summary: Callable[[], tuple[int, float | None]], store_now: float) -> None:
        """Say whether telemetry flows; a shared subscription that brings nothing falls back to a plain one."""
        problem = self.watch.problem(summary, store_now)
        if problem is not None and problem != self.health.silent.get(self.filter):
            log.warning("subscription %s: %s", self.filter, problem)
        self.health.subscription(self.filter, problem)
        if problem is None or not self.filter.startswith("$share/"):
            return
        plain = topics.device("+", "telemetry")
        log.warning("falling back from %s to a plain subscription, %s", self.filter, plain)
        self.health.subscription(self.filter, None)
        self.transport.subscribe(plain, 1)
        self.transport.unsubscribe(self.filter)
        self.filter = plain
        self.watch.restart()
