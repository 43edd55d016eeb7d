"""A real NATS cluster (JetStream, MQTT listeners) per test, on free ports in the test's temp dir."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.nats_cluster import NatsCluster, nats_binary, start_nats_cluster


@pytest.fixture
def nats(tmp_path: Path) -> Iterator[NatsCluster]:
    """Three NATS nodes clustered with JetStream; ``nats.urls`` are their MQTT URLs."""
    if nats_binary() is None:
        pytest.fail("nats-server is not installed: ./scripts/test installs it (apt-get install nats-server)")
    cluster = start_nats_cluster(tmp_path / "nats")
    yield cluster
    cluster.stop()
