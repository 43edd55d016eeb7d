"""Reconciliation: every device report the broker holds retained reaches the store.

Messages can be lost on their way to a controller without a word: a broker drops QoS 1 messages
beyond a slow client's queue (Mosquitto's ``max_queued_messages``), and the inbox drops the oldest
telemetry under a flood or while the store is down. Births, presence and states are retained on the
broker, so what was lost of them can be had again: after a reconnect, after an overflow and, while
a rollout waits for devices, every :data:`EVERY_S` seconds, :class:`Reconciler` opens a second,
short-lived connection, collects every retained report (on a thread of its own, so ingest goes
on), and hands them to the service, which compares each with the store and applies and counts
those that differ (``ControllerHealth.reconciliation``, ``edgectl_reconciled_reports_total``).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable

from edgecore.errors import EdgeError
from edgecore.protocol import topics
from edgecore.protocol.reports import Birth, DeviceState, Presence, Report
from edgecore.transport import TransportFactory
from edgectl.controller.clock import StoreClock
from edgectl.controller.inbox import Inbox, Received
from edgectl.controller.ingest import Ingest, StateReport
from edgectl.controller.records import DeviceRecord
from edgectl.controller.store import Store
from edgectl.controller.store.protocol import StoreUnavailable

__all__ = ["EVERY_S", "LEAVES", "Reconciler", "reconcile"]

log = logging.getLogger(__name__)

LEAVES = ("birth", "presence", "state")  # the retained reports
EVERY_S = 30.0


class Reconciler:
    """Collects the broker's retained reports when :meth:`due` (or periodically while devices are awaited)."""

    def __init__(self, factory: TransportFactory, every_s: float = EVERY_S, settle_s: float = 1.0, max_s: float = 30.0) -> None:
        self.factory, self.every_s, self.settle_s, self.max_s = factory, every_s, settle_s, max_s
        self._reasons: set[str] = set()
        self._found: queue.SimpleQueue[tuple[str, list[Received]]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._last = time.monotonic()

    def due(self, reason: str) -> None:
        """Reconcile at the next chance, saying ``reason`` (``reconnect``, ``overflow``, ``store back``)."""
        self._reasons.add(reason)

    def start_if_due(self, awaiting: Callable[[], bool]) -> bool:
        """Start a collection when one is due, or the period passed and ``awaiting()`` devices; whether it started."""
        if self._thread is not None and self._thread.is_alive():
            return False
        periodic = time.monotonic() - self._last >= self.every_s and awaiting()
        if not self._reasons and not periodic:
            return False
        why = ", ".join(sorted(self._reasons)) or "periodic, devices awaited"
        self._reasons.clear()
        self._last = time.monotonic()
        self._thread = threading.Thread(target=self._collect, args=(why,), name="reconcile", daemon=True)
        self._thread.start()
        return True

    def results(self) -> list[tuple[str, list[Received]]]:
        """Collections finished since the last call: (why, the retained reports received)."""
        done = []
        while True:
            try:
                done.append(self._found.get_nowait())
            except queue.Empty:
                return done

    def _collect(self, why: str) -> None:
        inbox = Inbox()
        transport = self.factory(inbox, lambda: None)
        for leaf in LEAVES:
            transport.subscribe(topics.device("+", leaf), 1)
        try:
            transport.connect()
        except EdgeError as exc:
            log.warning("reconciliation (%s) could not connect: %s; it runs again later", why, exc)
            self._reasons.add(why)
            return
        received: list[Received] = []
        deadline = time.monotonic() + self.max_s
        try:
            while time.monotonic() < deadline:
                try:
                    one = inbox.get_received(self.settle_s)
                except queue.Empty:
                    break  # the retained messages came at once; the flow has stopped
                if one.message.retain:
                    received.append(one)
        finally:
            transport.close()
        self._found.put((why, received))


def reconcile(found: list[Received], store: Store, ingest: Ingest, clock: StoreClock) -> tuple[Counter[str], list[StateReport]]:
    """Store each retained report that differs from the store's record (as received then); the counts by leaf, the states."""
    known = {d.id: d for d in store.devices()}
    counts: Counter[str] = Counter()
    states: list[StateReport] = []
    with store.batch():
        for received in found:
            report = _read(ingest, received)
            if report is None or not _differs(report, known.get(report.device_id)):
                continue
            at = clock.at(received.at)
            if ingest.stale(report, at):
                continue  # an older copy than what this controller stored moments ago (a lagging NATS node's view)
            counts[type(report).LEAF] += 1
            followup = ingest.apply(received.message, at)
            if isinstance(followup, StateReport):
                states.append(followup)
    return counts, states


def _read(ingest: Ingest, received: Received) -> Report | None:
    try:
        return ingest.read(received.message)
    except StoreUnavailable:
        raise
    except EdgeError as exc:
        log.warning("ignored %s: %s", received.message.topic, exc)
        return None


def _differs(report: Report, device: DeviceRecord | None) -> bool:
    """Whether a retained report says something the store's record of the device does not."""
    if isinstance(report, Birth):
        return device is None or device.birth != report
    if isinstance(report, Presence):
        return device is None or device.online != report.online
    if isinstance(report, DeviceState):
        return device is None or device.state != report
    return False
