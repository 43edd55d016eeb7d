"""A controller that outlives its database (issue 27.2): PostgreSQL stopped mid-rollout, then started again.

Issue 27 found: PostgreSQL restarted or stopped for 30 s, both controllers exited with
``internal error: AdminShutdown`` and did not come back, and the API answered a mix of 503 and 400
meanwhile. Here a real `edgectl controller run --http` on a PostgreSQL cluster of the test's own
(it is stopped with ``pg_ctl stop -m fast``, as an operator or a package upgrade does), a real
Mosquitto and light agents: while the store is down the process stays up, every API call that needs
the store answers one 503 with a one-line JSON error, ``/api/v1/health`` and ``/metrics`` say the store
is unavailable; when it is back the rollout finishes where it stood.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from edgectl.controller.records import DeviceStatus, Phase, RolloutStatus
from tests.adversarial.store_plane import DEVICES, Plane
from tests.fleet import wait_for

DOWN_S = 10.0


@pytest.mark.slow
def test_postgresql_stopped_mid_rollout_the_controller_stays_up_answers_503_and_finishes(plane: Plane) -> None:
    rid = plane.deploy(1)
    wait_for(lambda: (r := plane.rollout(rid)) is not None and r.phase is Phase.BAKING, 60, "wave 1 to bake", interval=0.05)

    assert plane.cluster is not None
    plane.cluster.halt()
    down_at = time.monotonic()
    try:
        # Every call that needs the store: one 503, its error one line of JSON naming the store, a Retry-After.
        status, raw, headers = plane.call("/api/v1/rollouts")
        assert status == 503, raw[:300]
        error = json.loads(raw)["error"]
        assert error["status"] == 503 and "store" in error["message"] and "\n" not in error["message"], error
        assert raw.count(b"\n") <= 1 and "Retry-After" in headers
        assert plane.call("/api/v1/devices")[0] == 503

        def unavailable() -> dict[str, Any] | None:
            health = plane.health()
            return health if health["status"] == "unavailable" else None

        health = wait_for(unavailable, 10, "the health to say the store is unavailable")
        assert health["store"]["up"] is False and health["store"]["error"], health
        status, metrics, _ = plane.call("/metrics", token=False)
        assert status == 200 and b"\nedgectl_controller_store_up 0.0\n" in metrics, metrics[:500]

        while time.monotonic() - down_at < DOWN_S:  # down for a while: the controller must not give up
            assert plane.alive(), plane.log_text()[-2000:]
            time.sleep(0.5)
    finally:
        plane.cluster.resume()

    ended = wait_for(lambda: (r := plane.rollout(rid)) is not None and r.status is not RolloutStatus.RUNNING and r, 40,
                     "the rollout to end after the store came back")
    assert ended.status is RolloutStatus.DONE, (ended.status, ended.reason)
    store = plane.store()
    try:
        rows = store.rollout_devices(rid)
        assert [r.status for r in rows] == [DeviceStatus.OK] * DEVICES, [(r.device_id, r.status, r.detail) for r in rows]
    finally:
        store.close()
    assert plane.alive()
    health = plane.health()
    assert health["store"]["up"] is True and health["store"]["outages"] == 1, health  # one outage, no flapping after it
    assert plane.call("/api/v1/rollouts")[0] == 200
    log = plane.log_text()
    assert "internal error" not in log and "Traceback" not in log, log[-3000:]
    assert "lost the engine lease" not in log, "the store's return cost the lease (a connection from before the outage)"
