"""A telemetry report is kept once in the history, whichever of two replicas stores it (both back-ends).

On a broker without shared subscriptions (NATS 2.9: MQTT 3.1.1) every controller replica receives every
telemetry report. Each used to keep its own history point and latency figure of it: the console showed each
point twice and a rate summed over replicas was twice the fleet's. Here two replicas are two stores (two
connections) on one database, a real PostgreSQL one or a SQLite file, each with its own :class:`Ingest` fed
the same reports: the store keeps one row per report (device, claimed time, model), both replicas pick the
same reports for the history, and their ``stored`` counters add up to the rows.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgecore.protocol import topics
from edgecore.protocol.envelope import TrustedKeys
from edgecore.protocol.telemetry import DeviceMetrics, LatencyFigures, ModelTelemetry, Telemetry
from edgecore.transport import Message
from edgecore.transport_memory import MemoryBroker
from edgectl.controller.history import TelemetryPoint
from edgectl.controller.ingest import Ingest
from edgectl.controller.service import Controller
from edgectl.controller.store import open_url
from tests.fleet import wait_for
from tests.postgres import PostgresCluster
from tests.store.conftest import MakeStore
from tests.unit.test_controller_dispatch import connections

POINT = TelemetryPoint("d1", 100.0, "det", 2, 1.0, 2.0, 30.0, 40.0, 10, None)
REPORTS = 12


def test_the_same_report_stored_by_two_replicas_is_one_row(make_store: MakeStore) -> None:
    a, b = make_store(), make_store(cache="cache-b")
    assert a.add_telemetry(POINT, 90.0) is True
    assert b.add_telemetry(replace(POINT, ts=100.2), 90.0) is False  # b received it 0.2 s later: a kept it already
    assert a.add_latency("d1", "det", 2, 2.0, "telemetry", 100.0, 90.0) is True
    assert b.add_latency("d1", "det", 2, 2.0, "telemetry", 100.2, 90.0) is False
    assert b.add_latency("d1", "other", 1, 7.0, "telemetry", 100.2, 90.0) is True  # the report's other model: its own
    assert [p.ts for p in b.telemetry_history("d1")] == [100.0]
    assert [(p.model, p.ts) for p in b.latency("d1")] == [("det", 100.0), ("other", 100.2)]
    # The device's next report, and another device's report claiming the same time, are rows of their own.
    assert b.add_telemetry(replace(POINT, ts=105.2), 95.0) is True
    assert a.add_telemetry(replace(POINT, device_id="d2"), 90.0) is True
    assert [p.ts for p in a.telemetry_history("d1")] == [100.0, 105.2]
    assert len(a.telemetry_history("d2")) == 1


def test_reports_that_claim_no_time_and_health_figures_are_kept_every_time(make_store: MakeStore) -> None:
    """Nothing tells two of them apart: each is kept (two replicas keep such a report twice)."""
    a, b = make_store(), make_store(cache="cache-b")
    assert a.add_telemetry(POINT) is True and b.add_telemetry(replace(POINT, ts=100.2)) is True
    assert a.add_latency("d1", "det", 2, 2.0, "health", 100.0) is True
    assert b.add_latency("d1", "det", 2, 2.0, "health", 100.0) is True
    assert [p.ts for p in a.telemetry_history("d1")] == [100.0, 100.2]
    assert len(a.latency("d1")) == 2


def _report(i: int, claimed: float | None) -> Message:
    """Report ``i`` of device d1: its CPU figure is ``i``, which tells the history's points apart."""
    stats = ModelTelemetry("2", requests=10 * i, latency_ms=LatencyFigures(1.0, 2.0 + i))
    report = Telemetry("d1", claimed, DeviceMetrics(cpu_percent=float(i)), {"det": stats})
    return Message(topics.device("d1", "telemetry"), report.to_payload(), False)


def _feed(a: Ingest, b: Ingest, reports: int, b_from: int, claimed: bool) -> None:
    """One report a second; a receives each 10 ms after it is sent, b 30 ms after, from report ``b_from`` on (a replica
    started later); each applies its reports in batches of its own, a in threes and b in twos."""
    for start in range(0, reports, 6):
        for ingest, size, offset in ((a, 3, 0.01), (b, 2, 0.03)):
            for first in range(start, start + 6, size):
                with ingest.batch():
                    for i in range(first, first + size):
                        if ingest is a or i >= b_from:
                            ingest.apply(_report(i, 1000.0 + i if claimed else None), 2000.0 + i + offset)


def test_two_replicas_ingesting_every_report_keep_one_history_point_per_report(make_store: MakeStore) -> None:
    a, b = Ingest(make_store()), Ingest(make_store(cache="cache-b"))
    _feed(a, b, 30, b_from=2, claimed=True)
    history = a.store.telemetry_history("d1")
    # Both keep the first report of each 5 s of claimed time (1000, 1005, ...): one row each, whoever wrote first.
    # b started at report 2, its first, which a did not keep. Before: b kept 2, 7, 12, ... and both rows of 5, 10, ...
    assert [p.cpu_percent for p in history] == [0, 2, 5, 10, 15, 20, 25]
    assert [round(p.ts, 2) for p in history] == [2000.01, 2002.03, 2005.01, 2010.01, 2015.01, 2020.01, 2025.01]
    assert [p.p95_ms for p in a.store.latency("d1", "det")] == [2.0, 4.0, 7.0, 12.0, 17.0, 22.0, 27.0]
    assert (a.stored, b.stored) == (6, 1)  # what each added: their sum is the fleet's
    device = b.store.device("d1")
    assert device is not None and device.telemetry is not None and device.telemetry.ts == 1029.0  # the device row: the last


def test_two_replicas_keep_each_report_that_claims_no_time(make_store: MakeStore) -> None:
    a, b = Ingest(make_store()), Ingest(make_store(cache="cache-b"))
    _feed(a, b, 12, b_from=0, claimed=False)
    history = a.store.telemetry_history("d1")
    assert [p.cpu_percent for p in history] == [0, 0, 5, 5, 10, 10]  # one a second apart: 5 s of receive time each
    assert (a.stored, b.stored) == (3, 3)


def test_two_controller_services_on_one_postgresql_store_keep_each_report_once(
        postgres: PostgresCluster, tmp_path: Path, stopping: list[threading.Thread]) -> None:
    """The service end to end: two replicas (the real ``Controller`` loop, each on its own store connections) on one
    PostgreSQL database and one broker without shared subscriptions (the in-memory one, like NATS 2.9: every replica
    receives every report). A device reports every 0.6 s while its clock claims a second each time, so a new period
    of claimed time begins every 3 s: the history holds the first report of each period once, and the replicas'
    ``stored`` counters add up to it while each ingested every report."""
    url, broker, key = postgres.create_database(), MemoryBroker(), Ed25519PrivateKey.generate()
    replicas = [Controller(open_url(url, packages_dir=tmp_path / name), connections(broker, f"ctl-{name}"), key,
                           TrustedKeys([key.public_key()]), tick_s=0.05, share_group="edgectl") for name in ("a", "b")]
    threads = [threading.Thread(target=c.run, daemon=True) for c in replicas]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: {"ctl-a", "ctl-b"} <= set(broker.clients()), 20, "both replicas to connect", interval=0.01)
        device = broker.transport("d1")
        device.connect()
        claimed = int(time.time()) // 5 * 5  # the device's clock at its first report: a period begins
        for i in range(REPORTS):
            assert device.publish(topics.device("d1", "telemetry"), _report(i, float(claimed + i)).payload, 0)
            time.sleep(0.6)  # spacing only: never shorter, so kept points are over half a period apart
        wait_for(lambda: all(c.messages >= REPORTS for c in replicas), 20, "both replicas to ingest every report")
        history = replicas[0].store.telemetry_history("d1")
        firsts = [float(i) for i in range(REPORTS) if i % 5 == 0]
        assert [p.cpu_percent for p in history] == firsts  # twice each before
        assert sum(c.ingest.stored for c in replicas) == len(firsts)
    finally:
        for controller, thread in zip(replicas, threads, strict=True):
            controller.stop()
            stopping.append(thread)
