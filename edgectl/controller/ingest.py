"""Device reports into the controller's store, and the fleet as the broker's retained reports show it.

Every report is read by :func:`edgecore.protocol.reports.read_report`, which also refuses a body
that names another device than its topic: the broker's ACL binds ``edge/v1/devices/<id>/...`` to
the certificate whose CN is ``<id>``, so the topic says who sent it.

Reports are ordered by when the controller received them, on the store's clock (the same for every
replica): a device's own claimed time (``ts``) is kept as data in the report, never used to keep an
older report over a newer one. One exception compares two of a device's reports on its own clock: a
birth or state delivered as retained (a resubscription, the reconciler) that claims an earlier time
than one this controller stored less than :data:`STALE_WITHIN_S` before is a stale copy (a NATS
node's retained view lags the stream) and is dropped (``stale-retained``).
A claimed time more than :data:`CLOCK_OFF_S` from the controller's is flagged once per device (log,
audit log, :attr:`Ingest.clock_off`).

The telemetry history keeps about one report per device every :data:`LATENCY_EVERY_S`. Replicas on a
broker without shared subscriptions (NATS) each receive every report, and must keep the same ones: a
report is picked when it is the first of a new period of the device's claimed time (the claimed time
picks samples, it orders nothing), and the store keeps its point and latency figures once per report
(device, claimed time, model), whichever replica writes first. :attr:`Ingest.stored` counts the
points this controller added, so the sum over replicas is the fleet's.
"""

from __future__ import annotations

import logging
import math
import queue
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from edgecore.errors import EdgeError, ProtocolError
from edgecore.protocol import topics
from edgecore.protocol.reports import (
    Birth,
    ChunkRequest,
    DeviceEvent,
    DeviceState,
    IdentityMismatch,
    LogAnswer,
    Presence,
    Report,
    Telemetry,
    read_report,
)
from edgecore.transport import Message, MqttTransport
from edgectl.controller.history import telemetry_point
from edgectl.controller.inbox import Drops
from edgectl.controller.logs import take_answer
from edgectl.controller.records import DeviceRecord
from edgectl.controller.store import Store

__all__ = ["EventReport", "FollowUp", "Ingest", "LiveBirth", "StateReport", "collect_devices"]

# Latency and telemetry history keep one telemetry point per device per this many seconds.
LATENCY_EVERY_S = 5.0
CLOCK_OFF_S = 300.0  # a device whose claimed time is further than this from the controller's is flagged
STALE_WITHIN_S = 60.0  # a retained copy older than a birth or state stored this recently is a lagging node's view
GONE_EVERY_S = 2.0  # how often the decommissioned devices are read again from the store
RETAINED = (Birth, Presence, DeviceState)

log = logging.getLogger(__name__)


def collect_devices(transport: MqttTransport, inbox: queue.Queue[Message], settle_s: float = 0.5,
                    max_s: float = 8.0, first_s: float = 2.0) -> dict[str, DeviceRecord]:
    """Subscribe to the retained device reports and gather them until the flow settles.

    The first message may take ``first_s`` (a clustered broker under load serves each subscription's retained
    messages from its own stream, seconds apart): a device heard in part (its birth, not yet its presence) read as
    not online and hid what the store knew."""
    for kind in RETAINED:
        transport.subscribe(topics.device("+", kind.LEAF), 1)
    devices: dict[str, DeviceRecord] = {}
    deadline = time.monotonic() + max_s
    wait = first_s
    while time.monotonic() < deadline:
        try:
            message = inbox.get(timeout=wait)
            wait = settle_s
        except queue.Empty:
            break
        try:
            report = read_report(message.topic, message.payload)
        except EdgeError as exc:
            log.warning("ignored %s: %s", message.topic, exc)
            continue
        if isinstance(report, RETAINED):
            devices[report.device_id] = devices.get(report.device_id, DeviceRecord(report.device_id)).observed(report)
    return devices


@dataclass(frozen=True)
class EventReport:
    """A deployment event, about the device its topic names."""

    device_id: str
    event: DeviceEvent


@dataclass(frozen=True)
class StateReport:
    """A device's retained state, for catching up on reports missed while the controller was down."""

    device_id: str
    state: DeviceState


@dataclass(frozen=True)
class LiveBirth:
    """A live (not retained) birth: the device connected just now."""

    device_id: str


FollowUp = EventReport | StateReport | LiveBirth


@dataclass(frozen=True)
class _Kept:
    """The last report of a device kept in the history: its period of claimed time (None: it claimed none), when received."""

    period: int | None
    received: float


@dataclass(frozen=True)
class _Recent:
    """A device's last birth or state stored by this controller: its claimed time, accepted sequence, when received."""

    claimed: float
    seq: int
    received: float


def _period(claimed: float | None) -> int | None:
    return None if claimed is None else math.floor(claimed / LATENCY_EVERY_S)


class Ingest:
    """Writes what devices report into the controller's store; returns what the rollouts must see.

    A body that names another device than its topic is dropped before anything is stored and
    counted in ``drops`` as ``identity``; a report of a decommissioned device (edgectl/fleet/lifecycle.py), as
    ``decommissioned``: it stays out of the fleet whatever it sends (the store's column is never cleared by a report,
    so one stored in the seconds before this process read the decommission changes its data, never its standing)."""

    def __init__(self, store: Store, drops: Drops | None = None) -> None:
        self.store = store
        self.drops = drops or Drops()
        self._kept: dict[str, _Kept] = {}  # device -> its last report kept in the history
        self._recent: dict[tuple[str, str], _Recent] = {}  # (device, leaf) -> its last birth or state stored here
        self.clock_off: dict[str, float] = {}  # device -> claimed minus received seconds, for devices flagged
        self.stored = 0  # history points this controller added to the store (committed)
        self._added = 0  # history points added by the batch in progress (see batch)
        self._in_batch = False
        self._gone: set[str] = set()
        self._gone_at = -GONE_EVERY_S

    def decommissioned(self, device_id: str) -> bool:
        """Whether the device was taken out of the fleet (as of the last read of the store, at most seconds ago)."""
        if time.monotonic() - self._gone_at >= GONE_EVERY_S:
            self._gone, self._gone_at = self.store.decommissioned_ids(), time.monotonic()
        return device_id in self._gone

    @contextmanager
    def batch(self) -> Iterator[None]:
        """One store transaction around the reports applied inside it. If it fails, what this object noted of
        those reports is undone with the transaction: the batch is retried (service.py) and must keep the same
        history points, and flag the same clocks, when the store answers again (a point per device and outage
        was lost before). A point PostgreSQL wrote at once before the failure stays, once (the retry finds it kept),
        and goes uncounted in :attr:`stored`: at most one per device and failed batch."""
        kept, clock_off, recent = dict(self._kept), dict(self.clock_off), dict(self._recent)
        self._added, self._in_batch = 0, True
        try:
            with self.store.batch():
                yield
        except BaseException:
            self._kept, self.clock_off, self._recent = kept, clock_off, recent
            raise
        else:
            self.stored += self._added
        finally:
            self._added, self._in_batch = 0, False

    def read(self, message: Message) -> Report | None:
        """The report in ``message``; None (counted) when its body names another device or its device was decommissioned.
        Raises EdgeError when malformed."""
        try:
            report = read_report(message.topic, message.payload)
        except IdentityMismatch as exc:
            self.drops.count("identity", message.topic, str(exc))
            return None
        except ProtocolError as exc:
            if not message.topic.endswith(f"/{LogAnswer.LEAF}"):
                raise
            self.drops.count("malformed-logs", message.topic, str(exc))  # an operator waits on it: counted, not just logged
            return None
        if self.decommissioned(report.device_id):
            self.drops.count("decommissioned", message.topic, f"device {report.device_id} was decommissioned")
            return None
        return report

    def stale(self, report: Report, received: float) -> bool:
        """Whether a birth or state delivered as retained (a resubscription, the reconciler) is an older copy of one this
        controller stored less than :data:`STALE_WITHIN_S` before ``received``: a NATS node's view of the retained
        messages lags the stream the other nodes write. Older means an earlier claimed time and, for a state, no later
        accepted sequence number, on a device whose clock is not flagged off: both times are the device's own clock,
        read seconds apart. Pure: the caller counts the drop."""
        if not isinstance(report, (Birth, DeviceState)) or report.ts is None or report.device_id in self.clock_off:
            return False
        last = self._recent.get((report.device_id, report.LEAF))
        if last is None or received - last.received > STALE_WITHIN_S or report.ts >= last.claimed:
            return False
        return not isinstance(report, DeviceState) or report.last_seq <= last.seq

    def _remember(self, report: Birth | DeviceState, received: float) -> None:
        if report.ts is not None:
            seq = report.last_seq if isinstance(report, DeviceState) else 0
            self._recent[(report.device_id, report.LEAF)] = _Recent(report.ts, seq, received)

    def apply(self, message: Message, received: float) -> EventReport | StateReport | None:
        """Store one device report received at ``received`` (the store's clock); return what the rollouts must see."""
        report = self.read(message)
        if report is None or isinstance(report, ChunkRequest):
            return None  # the artifact server answers chunk requests (see chunk_request)
        if message.retain and self.stale(report, received):
            self.drops.count("stale-retained", message.topic, f"a retained {type(report).LEAF} of device "
                             f"{report.device_id} claims {report.ts}, older than the one stored moments ago")
            return None
        self._check_clock(report.device_id, report.ts, received)
        if isinstance(report, Presence):
            self.store.upsert_device(report.device_id, online=int(report.online), last_seen=received, presence_at=received)
        elif isinstance(report, DeviceEvent):
            e = report
            self.store.add_event(e.device_id, e.ts, e.deployment_id, e.state, e.status, e.detail, e.data)
            self.store.upsert_device(e.device_id, last_seen=received)
            return EventReport(e.device_id, e)
        elif isinstance(report, Birth):
            self.store.upsert_device(report.device_id, birth=report, last_seen=received, birth_at=received)
            self._remember(report, received)
        elif isinstance(report, DeviceState):
            self.store.upsert_device(report.device_id, state=report, last_seen=received, state_at=received)
            self._remember(report, received)
            return StateReport(report.device_id, report)
        elif isinstance(report, LogAnswer):
            if not take_answer(self.store, report, received):
                self.drops.count("unasked-logs", message.topic, f"answer {report.request_id} to no open request of the device")
        else:
            self._telemetry(report, received)
        return None

    def _check_clock(self, device_id: str, claimed: float | None, received: float) -> None:
        """Flag, once per device while it lasts, a claimed time far from the controller's."""
        if claimed is None:
            return
        off = claimed - received
        if abs(off) <= CLOCK_OFF_S:
            self.clock_off.pop(device_id, None)
            return
        if device_id not in self.clock_off:
            detail = f"its reports claim a time {abs(off):.0f}s {'ahead of' if off > 0 else 'behind'} the controller's clock"
            log.warning("device %s: %s (kept as data; reports are ordered by when they arrive)", device_id, detail)
            self.store.audit("device clock off", detail, device_id=device_id)
        self.clock_off[device_id] = off

    def chunk_request(self, message: Message) -> ChunkRequest | None:
        """The chunk request in ``message`` from the device its topic names; None for any other report or device."""
        report = self.read(message)
        return report if isinstance(report, ChunkRequest) else None

    def _telemetry(self, report: Telemetry, received: float) -> None:
        device_id = report.device_id
        self.store.upsert_device(device_id, telemetry=report, telemetry_ts=received, last_seen=received, online=1,
                                 telemetry_at=received)
        if not self._keeps(device_id, report.ts, received):
            return
        self._kept[device_id] = _Kept(_period(report.ts), received)
        # Keyed by the claimed time: a report another replica stored already adds nothing. One that claims no time
        # cannot be told from another: every replica that receives it stores it.
        if self.store.add_telemetry(telemetry_point(report, received), report.ts):
            if self._in_batch:
                self._added += 1
            else:
                self.stored += 1
        for name, stats in report.models.items():
            if stats.latency_ms.p95 is not None and stats.version.isdigit():
                self.store.add_latency(device_id, name, int(stats.version), stats.latency_ms.p95, "telemetry", received,
                                       report.ts)

    def _keeps(self, device_id: str, claimed: float | None, received: float) -> bool:
        """Whether this report goes into the history: the device's first, then the first of each new period of its
        claimed time (the same report on every replica). Time received bounds it whatever the device claims: never
        within half a period of the last kept (claimed times that jump cannot flood the history), and at the latest
        after two (a clock that stands still); a report that claims no time, a period after the last kept."""
        last = self._kept.get(device_id)
        if last is None:
            return True
        since = received - last.received
        period = _period(claimed)
        if period is None or last.period is None:
            return since >= LATENCY_EVERY_S
        return since >= LATENCY_EVERY_S / 2 and (period != last.period or since >= 2 * LATENCY_EVERY_S)
