"""A batch of reports the store failed is retried whole, the telemetry history point it held included.

The controller keeps about one telemetry report per device every 5 s in the history, and noted its pick before
the batch's transaction committed: when the store failed the batch (StoreUnavailable) and the controller retried
it once the store answered, the report was no longer picked, and the device's history lost a point per outage.
Here the controller service runs on the in-memory broker (edgecore.transport_memory) with its SQLite store on a
real small filesystem (tmpfs; skipped where the test may not mount one): a device's report is stored, the disk
fills, the next report's batch fails for real (the kernel's ENOSPC), the disk is freed, and both reports are in
the history, each counted once.
"""

from __future__ import annotations

import sqlite3
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgecore.protocol import topics
from edgecore.protocol.envelope import TrustedKeys
from edgecore.protocol.telemetry import DeviceMetrics, Telemetry
from edgecore.transport_memory import MemoryBroker
from edgectl.controller import SqliteStore
from edgectl.controller.ingest import LATENCY_EVERY_S
from edgectl.controller.service import Controller
from tests.deploy.conftest import fill, mount_small_disk
from tests.fleet import wait_for
from tests.unit.test_controller_dispatch import connections

DEVICE = "dev-a"
WAIT_S = 20.0


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A real 4 MiB tmpfs for the store, unmounted after the test."""
    mounted = mount_small_disk(tmp_path / "disk", "4m")
    try:
        yield mounted
    finally:
        subprocess.run(["umount", "-l", str(mounted)], check=False)


def _cpu(store: SqliteStore) -> float | None:
    device = store.device(DEVICE)
    return None if device is None or device.telemetry is None else device.telemetry.device.cpu_percent


def test_a_report_whose_batch_the_store_failed_keeps_its_history_point(disk: Path, stopping: list[threading.Thread]) -> None:
    broker = MemoryBroker()
    store = SqliteStore(disk / "controller.db")
    key = Ed25519PrivateKey.generate()
    service = Controller(store, connections(broker, "controller"), key, TrustedKeys([key.public_key()]), tick_s=0.05)
    thread = threading.Thread(target=service.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: broker.subscribed("controller", topics.device("any", "telemetry")), WAIT_S,
                 "the controller to subscribe", interval=0.01)
        device = broker.transport(DEVICE)
        device.connect()
        claimed = time.time()

        def report(cpu: float, ts: float) -> None:
            assert device.publish(topics.device(DEVICE, "telemetry"), Telemetry(DEVICE, ts, DeviceMetrics(cpu)).to_payload(), 0)

        report(1.0, claimed)
        wait_for(lambda: [p.cpu_percent for p in store.telemetry_history(DEVICE)] == [1.0], WAIT_S, "the first point")
        first_at = time.monotonic()

        # The disk fills: the write-ahead log emptied first (a checkpoint), so the next commit needs room it lacks.
        with sqlite3.connect(store.path) as db:
            assert db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0, "the checkpoint was blocked"
        filler = fill(disk)
        # The next report is due in the history: the next period of claimed time, more than half a period received later.
        time.sleep(max(0.0, first_at + LATENCY_EVERY_S / 2 + 0.5 - time.monotonic()))
        report(2.0, claimed + LATENCY_EVERY_S)
        health = wait_for(lambda: (h := service.health.snapshot())["store"]["error"] and h, WAIT_S,
                          "the controller to say the store failed")
        assert "full" in health["store"]["error"], health
        assert _cpu(store) == 1.0 and len(store.telemetry_history(DEVICE)) == 1  # the batch rolled back whole

        filler.unlink()
        wait_for(lambda: _cpu(store) == 2.0, WAIT_S, "the retried batch to commit once the disk has room")
        assert [p.cpu_percent for p in store.telemetry_history(DEVICE)] == [1.0, 2.0]  # was [1.0]: the point was lost
        assert service.ingest.stored == 2  # each counted once, when its batch committed
        assert service.health.snapshot()["store"]["outages"] == 1
    finally:
        service.stop()
        thread.join(WAIT_S)
        stopping.append(thread)
