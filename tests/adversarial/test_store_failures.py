"""A controller whose store refuses writes, and an API flooded with unknown tokens (issue 27.2).

- PostgreSQL turned read-only mid-rollout, as an operator or a failover onto a replica does
  (``default_transaction_read_only`` set for the whole cluster and reloaded): the real
  ``edgectl controller run --http`` stays up, a call that writes answers one 503 with a one-line
  JSON error while reads still answer, ``/api/v1/health`` and ``/metrics`` say the store is
  unavailable (read-only); made writable again, the rollout finishes where it stood and the reports
  devices sent meanwhile are in the store.
- The SQLite store's disk fills (the store on a small tmpfs, filled up by a file): the controller
  stays up and says so; the file deleted, it ingests again without a restart.
- 130 connections at once, each with a well-formed but unknown token, against a real API server on
  PostgreSQL: the sessions it opens stay within its store's pool while all of them are in flight,
  every one is answered 401, and an admin's token still gets 200.
"""

from __future__ import annotations

import json
import secrets
import select
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edgectl.api import Accounts, ApiServer, api_context, api_routes
from edgectl.config import EdgectlConfig
from edgectl.controller.accounts import Role
from edgectl.controller.records import DeviceStatus, Phase, RolloutStatus
from edgectl.controller.store.postgres import PostgresStore
from tests.adversarial.store_plane import DEVICES, Plane, running_plane
from tests.deploy.conftest import fill, mount_small_disk
from tests.fleet import wait_for
from tests.postgres import PostgresCluster

READ_ONLY_S = 10.0  # how long the database refuses writes
FULL_S = 5.0  # how long the disk stays full once the controller said so
DISK_SIZE = "8m"  # the tmpfs under the SQLite store
FLOOD = 130  # connections with unknown tokens, all in flight at once
POOL = 4  # the flooded API's store pool: fewer than its workers, so the pool is the bound


def _one_line_503(answer: tuple[int, bytes, dict[str, str]], about: str) -> None:
    """One 503: its error one line of JSON that says ``about``, and a Retry-After."""
    status, raw, headers = answer
    assert status == 503, raw[:300]
    error = json.loads(raw)["error"]
    assert error["status"] == 503 and about in error["message"] and "\n" not in error["message"], error
    assert raw.count(b"\n") <= 1 and "Retry-After" in headers


def _unavailable(plane: Plane, about: str) -> dict[str, Any] | None:
    assert plane.alive(), plane.log_text()[-2000:]
    health = plane.health()
    return health if health["status"] == "unavailable" and about in (health["store"]["error"] or "") else None


# -- PostgreSQL read-only ------------------------------------------------------------------------


def _read_only(cluster: PostgresCluster, on: bool) -> None:
    """Every transaction of every session read-only from now on (or no more), as ``ALTER SYSTEM`` and a reload make it."""
    import psycopg

    # This session writes the setting whatever the cluster's default is by then.
    with psycopg.connect(cluster.url(), autocommit=True, options="-c default_transaction_read_only=off") as db:
        db.execute("ALTER SYSTEM SET default_transaction_read_only = on" if on
                   else "ALTER SYSTEM RESET default_transaction_read_only")
        db.execute("SELECT pg_reload_conf()")

    def in_force() -> bool:  # the reload is a signal: a new session sees it once the server has read the file
        with psycopg.connect(cluster.url(), autocommit=True) as db:
            row = db.execute("SHOW default_transaction_read_only").fetchone()
            return row is not None and row[0] == ("on" if on else "off")

    wait_for(in_force, 10, f"default_transaction_read_only {'on' if on else 'off'}", interval=0.05)


@pytest.mark.slow
def test_postgresql_turned_read_only_mid_rollout_the_controller_stays_up_and_finishes(plane: Plane) -> None:
    assert plane.cluster is not None
    rid = plane.deploy(1)
    wait_for(lambda: (r := plane.rollout(rid)) is not None and r.phase is Phase.BAKING, 60, "wave 1 to bake", interval=0.05)

    since = time.time()
    _read_only(plane.cluster, True)
    try:
        health = wait_for(lambda: _unavailable(plane, "read-only"), 15,
                          "the health to say the store is unavailable (read-only)")
        noticed = time.time()  # from now on what devices send waits in the controller's memory
        assert health["store"]["up"] is False, health
        assert plane.metric("edgectl_controller_store_up") == 0.0
        # A call that writes: one 503 naming the store; it took no effect (the rollout is not paused below).
        _one_line_503(plane.call(f"/api/v1/rollouts/{rid}/pause", method="POST"), "read-only")
        _one_line_503(plane.call("/api/v1/users", method="POST", body={"name": "bob", "role": "viewer"}), "read-only")
        # A read-only database still answers reads.
        status, raw, _ = plane.call(f"/api/v1/rollouts/{rid}")
        assert status == 200 and json.loads(raw)["status"] == "running", raw[:300]
        while time.time() - since < READ_ONLY_S:  # refused for a while: the controller must not give up, nor flap
            assert plane.alive(), plane.log_text()[-2000:]
            assert plane.health()["status"] == "unavailable"
            time.sleep(0.5)
    finally:
        _read_only(plane.cluster, False)
    until = time.time()

    ended = wait_for(lambda: (r := plane.rollout(rid)) is not None and r.status is not RolloutStatus.RUNNING and r, 40,
                     "the rollout to end after the store took writes again")
    assert ended.status is RolloutStatus.DONE, (ended.status, ended.reason)
    store = plane.store()
    try:
        rows = store.rollout_devices(rid)
        assert [r.status for r in rows] == [DeviceStatus.OK] * DEVICES, [(r.device_id, r.status, r.detail) for r in rows]
        devices = store.devices()
        assert sorted((d.id, [(m.name, m.version) for m in d.models]) for d in devices) == \
            [(f"sim-{i:03d}", [("clf", 1)]) for i in range(DEVICES)]
        assert store.user("bob") is None  # the refused write left nothing behind
        # What devices sent while the store refused writes waited in memory and is stored now (one telemetry point
        # per device per 5 s goes to the history; the bounded buffer dropped nothing here).
        assert not plane.metric("edgectl_dropped_messages_total", 'reason="overflow"')
        for device in devices:
            meanwhile = [p.ts for p in store.telemetry_history(device.id, since=noticed) if p.ts < until]
            assert meanwhile, f"{device.id}: no telemetry of the read-only window reached the store"
    finally:
        store.close()
    assert plane.alive()
    health = plane.health()
    assert health["status"] != "unavailable" and health["store"]["outages"] == 1, health
    assert plane.call("/api/v1/users", method="POST", body={"name": "bob", "role": "viewer"})[0] == 201
    log = plane.log_text()
    assert "internal error" not in log and "Traceback" not in log, log[-3000:]


# -- SQLite on a full disk -----------------------------------------------------------------------


@pytest.fixture
def store_disk(tmp_path: Path) -> Iterator[Path]:
    """A real tmpfs of :data:`DISK_SIZE` for the store (skipped where this process may not mount one), unmounted after."""
    disk = mount_small_disk(tmp_path / "disk", DISK_SIZE)
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


@pytest.fixture
def sqlite_plane(tmp_path: Path, home_for: Any, store_disk: Path) -> Iterator[Plane]:
    with running_plane(tmp_path, home_for, str(store_disk / "controller.db")) as found:
        yield found


@pytest.mark.slow
def test_the_sqlite_store_s_disk_fills_the_controller_stays_up_and_ingests_again_once_it_has_room(
        sqlite_plane: Plane) -> None:
    plane = sqlite_plane
    filler = fill(Path(plane.url).parent)
    try:
        health = wait_for(lambda: _unavailable(plane, "full"), 30, "the health to say the store is unavailable (disk full)")
        assert health["store"]["up"] is False, health
        assert plane.metric("edgectl_controller_store_up") == 0.0
        _one_line_503(plane.call("/api/v1/users", method="POST", body={"name": "bob", "role": "viewer"}), "full")
        plane.fleet.stop("sim-002")  # says goodbye: a change of state the store must get once it has room
        full_at = time.monotonic()
        while time.monotonic() - full_at < FULL_S:  # devices keep reporting; the controller must not give up, nor flap
            assert plane.alive(), plane.log_text()[-2000:]
            assert plane.health()["status"] == "unavailable"
            time.sleep(0.5)
    finally:
        filler.unlink()
    freed = time.time()

    def ingested() -> bool:
        store = plane.store()
        try:
            devices = {d.id: d for d in store.devices()}
        finally:
            store.close()
        reporting = all((devices[f"sim-{i:03d}"].telemetry_ts or 0.0) > freed for i in range(DEVICES - 1))
        return reporting and devices["sim-002"].online is False

    wait_for(ingested, 30, "new telemetry, and sim-002's goodbye, in the store once the disk has room")
    assert plane.call("/api/v1/users", method="POST", body={"name": "bob", "role": "viewer"})[0] == 201
    assert plane.alive()  # the same process all along: no restart
    health = wait_for(lambda: (h := plane.health())["store"]["up"] and h, 10, "the health to say the store is back")
    assert health["store"]["outages"] == 1, health
    assert plane.metric("edgectl_controller_store_up") == 1.0
    log = plane.log_text()
    assert "internal error" not in log and "Traceback" not in log, log[-3000:]


# -- unknown tokens ------------------------------------------------------------------------------


def _unknown_token() -> str:
    """Well-formed (edgectl_<12 hex>_<43 URL-safe characters>, as edgectl.api.accounts makes them), and no one's."""
    return f"edgectl_{secrets.token_hex(6)}_{secrets.token_urlsafe(32)}"


def _sessions(cluster: PostgresCluster, dbname: str) -> int:
    """Client sessions on ``dbname`` now, this one aside (a fresh transaction each time: its snapshot of them is fresh)."""
    import psycopg

    with psycopg.connect(cluster.url(), autocommit=True) as db:
        row = db.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND backend_type = 'client backend' "
                         "AND pid <> pg_backend_pid()", (dbname,)).fetchone()
        return int(row[0]) if row else 0


def _send(port: int, token: str, source: str) -> socket.socket:
    """A request for ``/api/v1/devices`` with ``token``, from ``source`` (a loopback address), sent whole; its answer unread."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=60, source_address=(source, 0))
    sock.sendall(f"GET /api/v1/devices HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
                 "Connection: close\r\n\r\n".encode())
    return sock


def _status(sock: socket.socket) -> tuple[int, bytes]:
    with sock:
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def test_unknown_tokens_cost_no_database_session_per_connection(tmp_path: Path, postgres: PostgresCluster) -> None:
    """Each unknown token is looked up once, on a session of the store's pool (a caller waits for one, up to 5 s): 401.

    No cache of unknown ids is needed for this: an attacker makes a fresh id per request for free, so such a cache
    would save nothing here, while the pool bounds the sessions whatever the ids."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    url = postgres.create_database()
    dbname = str(conninfo_to_dict(url)["dbname"])
    store = PostgresStore(url, tmp_path / "cache", pool_size=POOL)
    accounts = Accounts(store)
    accounts.add_user("ann", Role.ADMIN, "test")
    admin = accounts.create_token("ann", "", None, "test")[1]
    store.release()
    ctx = api_context(store, EdgectlConfig())
    server = ApiServer(ctx, api_routes(ctx), "127.0.0.1", 0).start()
    flood: list[socket.socket] = []
    try:
        # Every token lookup waits on this lock: the moment when the flood could hold the most sessions is held still.
        with psycopg.connect(url, autocommit=True) as locker:
            locker.execute("BEGIN")
            locker.execute("LOCK TABLE tokens IN ACCESS EXCLUSIVE MODE")
            # From a few loopback addresses: the server takes at most 64 connections from one.
            flood = [_send(server.port, _unknown_token(), f"127.0.0.{10 + i % 4}") for i in range(FLOOD)]
            answered: list[tuple[int, bytes]] = []  # an admin's request, sent while the flood is in flight
            asked = threading.Thread(target=lambda: answered.append(_status(_send(server.port, admin, "127.0.0.9"))))
            asked.start()
            wait_for(lambda: _sessions(postgres, dbname) >= POOL + 1, 10, "the lookups to wait on the lock")
            held = []  # the lock holder's own session counts: +1
            for _ in range(10):
                held.append(_sessions(postgres, dbname))
                time.sleep(0.02)
            early = select.select(flood, [], [], 0)[0]  # every one of them still waits for its answer
            locker.execute("COMMIT")
        statuses = [_status(sock)[0] for sock in flood]
        asked.join(30)
    finally:
        for sock in flood:
            sock.close()
        server.stop()
        store.close()
    assert not early, f"{len(early)} of the {FLOOD} connections were answered before the lookups could run"
    assert max(held) <= POOL + 1, f"{max(held)} sessions for {FLOOD} connections in flight: the pool holds {POOL}"
    assert statuses == [401] * FLOOD, sorted(set(statuses))
    assert answered, "the admin's request got no answer"
    status, body = answered[0]
    assert status == 200 and "devices" in json.loads(body), body[:300]
