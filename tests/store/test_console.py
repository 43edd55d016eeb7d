"""The console's store methods (device pages and counts, users, tokens, packages) and telemetry history,
on SQLite and on PostgreSQL: the same answers from both engines."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from edgecore.protocol.reports import Birth, DeviceState, RunningModel, Telemetry
from edgectl.controller.accounts import Role, TokenRow, UserRow
from edgectl.controller.history import TelemetryPoint, telemetry_point, with_rates
from edgectl.controller.queries import DeviceQuery, UploadedPackage
from edgectl.controller.records import PackageRef
from edgectl.controller.store import LATEST, Retention, SqliteStore, Store
from tests.store.conftest import MakeStore

FLEET = [  # id, target, tags, active model or None, online
    ("cam-01", "cpu-x86", {"site": "lobby", "floor": "1"}, ("det", 2), 1),
    ("cam-02", "cpu-x86", {"site": "lobby"}, ("det", 1), 0),
    ("cam-03", "jetson-orin", {"site": "Dock_A"}, ("seg", 2), 1),
    ("gw-100", "rpi4", {}, None, None),
    ("gw-101", "rpi4", {"site": "50%"}, None, 1),
]


def fleet(store: Store) -> None:
    for device_id, target, tags, active, online in FLEET:
        state = DeviceState(device_id, active=RunningModel(*active) if active else None)
        store.upsert_device(device_id, birth=Birth(device_id, agent_version="0.9", target=target, tags=tags), birth_at=1.0,
                            state=state, state_at=1.0)
        if online is not None:
            store.upsert_device(device_id, online=online, presence_at=1.0)


def ids(store: Store, *terms: tuple[str, str], version: int | None = None, text: str = "", limit: int = 100,
        offset: int = 0) -> tuple[list[str], int]:
    page = store.device_page(DeviceQuery(terms, version, text, limit, offset))
    return [r.id for r in page.rows], page.total


def test_device_pages_filter_count_and_page_in_the_store(store: Store) -> None:
    fleet(store)
    assert ids(store, limit=2, offset=1) == (["cam-02", "cam-03"], 5)
    assert ids(store, ("target", "cpu-x86")) == (["cam-01", "cam-02"], 2)
    assert ids(store, ("target", "cpu*")) == (["cam-01", "cam-02"], 2)
    assert ids(store, ("status", "online")) == (["cam-01", "cam-03", "gw-101"], 3)
    assert ids(store, ("status", "unknown")) == (["gw-100"], 1)
    assert ids(store, ("model", "det")) == (["cam-01", "cam-02"], 2)
    assert ids(store, ("model", "det"), version=2) == (["cam-01"], 1)
    assert ids(store, ("site", "lobby"), ("floor", "1")) == (["cam-01"], 1)
    assert ids(store, ("id", "gw-*")) == (["gw-100", "gw-101"], 2)
    assert ids(store, ("agent", "0.9")) == ([d[0] for d in FLEET], 5)
    assert ids(store, text="dock") == (["cam-03"], 1)  # a tag value, either case
    assert ids(store, text="ORIN") == (["cam-03"], 1)
    assert ids(store, ("site", "50%")) == (["gw-101"], 1)
    assert ids(store, text="%") == (["gw-101"], 1)  # LIKE wildcards in the text are literal
    assert ids(store, text="_") == (["cam-03"], 1)
    assert ids(store, ("site", "nowhere")) == ([], 0)
    row = store.device_page(DeviceQuery((("id", "cam-01"),))).rows[0]
    assert row.birth is not None and row.birth.tags == {"site": "lobby", "floor": "1"} and row.active == RunningModel("det", 2)


def test_device_counts_models_and_tag_keys(store: Store) -> None:
    assert (store.device_counts(), store.device_models(), store.device_tag_keys()) == ({}, {}, set())
    fleet(store)
    assert store.device_counts() == {("cpu-x86", "online"): 1, ("cpu-x86", "offline"): 1, ("jetson-orin", "online"): 1,
                                     ("rpi4", "unknown"): 1, ("rpi4", "online"): 1}
    assert store.device_models() == {("det", 2): 1, ("det", 1): 1, ("seg", 2): 1, ("", None): 2}
    assert store.device_tag_keys() == {"site", "floor"}


def test_ingest_lags_from_numeric_report_times(store: Store) -> None:
    now = time.time()
    store.upsert_device("d1", telemetry=Telemetry("d1", now - 2.5), telemetry_ts=now, telemetry_at=now - 2.5)
    store.upsert_device("d2", telemetry=Telemetry("d2", None), telemetry_ts=now, telemetry_at=now)  # no time of its own
    store.upsert_device("d3", telemetry=Telemetry("d3", now - 100), telemetry_ts=now - 99, telemetry_at=now - 100)
    assert [round(lag, 3) for lag in store.ingest_lags(now - 10)] == [2.5]


def test_users_and_tokens(make_store: MakeStore) -> None:
    store, other = make_store(), make_store()  # a second controller (or `edgectl tokens`) on the same store
    assert store.add_user(UserRow("ann", Role.ADMIN, 1.0)) is True
    assert other.add_user(UserRow("ann", Role.VIEWER, 2.0)) is False  # the name is taken
    store.add_user(UserRow("bob", Role.OPERATOR, 3.0))
    assert other.users() == [UserRow("ann", Role.ADMIN, 1.0), UserRow("bob", Role.OPERATOR, 3.0)]
    assert other.user("bob") == UserRow("bob", Role.OPERATOR, 3.0) and other.user("carl") is None
    store.add_token(TokenRow("t1", "ann", "laptop", "a" * 64, 10.0, expires=100.0))
    store.add_token(TokenRow("t2", "bob", "", "b" * 64, 11.0))
    store.add_token(TokenRow("t3", "bob", "ci", "c" * 64, 12.0))
    assert [t.id for t in other.tokens()] == ["t1", "t2", "t3"]
    assert [t.id for t in other.tokens("bob")] == ["t2", "t3"]
    assert other.token("t1") == TokenRow("t1", "ann", "laptop", "a" * 64, 10.0, 100.0, None)
    assert other.token("nope") is None
    assert other.revoke_token("t2", 20.0) is True
    assert store.revoke_token("t2", 21.0) is False  # revoked already: the first time stays
    assert (store.token("t2") or TokenRow("", "", "", "", 0)).revoked == 20.0
    assert store.remove_user("bob", 30.0) is True and store.remove_user("bob", 31.0) is False
    assert [(t.id, t.revoked) for t in other.tokens("bob")] == [("t2", 20.0), ("t3", 30.0)]
    assert [u.name for u in other.users()] == ["ann"]


def test_uploaded_packages(make_store: MakeStore) -> None:
    store, other = make_store(), make_store()
    ref = PackageRef("v" * 64, "a1", "det", 2, "cpu-x86", "det@2 int8", "/keep/v.edgepkg", 1234)
    store.save_package(UploadedPackage(ref, 5.0, "api:ann"))
    store.save_package(UploadedPackage(PackageRef("w" * 64, "a2", "det", 3, "any", "det@3", "/keep/w.edgepkg", 9), 6.0, ""))
    store.save_package(UploadedPackage(ref, 7.0, "api:bob"))  # uploaded again: the newer entry
    assert [(p.ref.variant[0], p.uploaded, p.actor) for p in other.packages()] == [("w", 6.0, ""), ("v", 7.0, "api:bob")]
    assert other.packages()[1].ref == ref


def test_telemetry_history_round_trip_and_order(store: Store) -> None:
    for i in range(5):
        store.add_telemetry(TelemetryPoint("d1", 100.0 + i, "det", 2, 1.0 + i, 2.0 + i, 30.0, 40.5, 10 * i, None))
    store.add_telemetry(TelemetryPoint("d2", 100.0, cpu_percent=5.0))
    assert [p.ts for p in store.telemetry_history("d1")] == [100.0, 101.0, 102.0, 103.0, 104.0]
    assert [p.ts for p in store.telemetry_history("d1", limit=2)] == [103.0, 104.0]
    assert [p.ts for p in store.telemetry_history("d1", since=103.0)] == [103.0, 104.0]
    assert store.telemetry_history("d1")[4] == TelemetryPoint("d1", 104.0, "det", 2, 5.0, 6.0, 30.0, 40.5, 40, None)
    assert store.telemetry_history("d2") == [TelemetryPoint("d2", 100.0, cpu_percent=5.0)]
    assert store.telemetry_history("nope") == []


def test_telemetry_history_is_bounded_by_the_retention(make_store: MakeStore) -> None:
    store = make_store(Retention(latency_rows=0, events=0, max_age_s=100, every_s=3600, telemetry_rows=3))
    now = time.time()
    for i in range(6):
        store.add_telemetry(TelemetryPoint("d1", now - 5 + i, cpu_percent=float(i)))
    store.add_telemetry(TelemetryPoint("d2", now - 500, cpu_percent=1.0))  # older than the age limit
    store.add_telemetry(TelemetryPoint("d2", now, cpu_percent=2.0))
    assert len(store.telemetry_history("d1")) == 6  # nothing pruned before it is due
    store.prune(now)
    assert [p.cpu_percent for p in store.telemetry_history("d1")] == [3.0, 4.0, 5.0]
    assert [p.cpu_percent for p in store.telemetry_history("d2")] == [2.0]


def test_points_from_agent_and_light_agent_reports() -> None:
    agent = Telemetry.from_json({
        "device_id": "d1", "ts": 5.0, "device": {"cpu_percent": 12.5, "memory_percent": 40.0, "memory_used_bytes": 1},
        "models": {"shadow": {"version": "1", "requests": 3, "window_requests": 3, "throughput_rps": 0.05,
                              "latency_ms": {"p50": 9.0, "p95": 12.0}},
                   "det": {"version": "2", "requests": 900, "window_requests": 600, "throughput_rps": 10.0,
                           "latency_ms": {"p50": 4.0, "p95": 6.5, "p99": 8.0}}}})
    assert telemetry_point(agent, 5.0) == TelemetryPoint("d1", 5.0, "det", 2, 4.0, 6.5, 12.5, 40.0, 903, 10.05)
    light = Telemetry.from_json({"device_id": "d1", "device": {"cpu_percent": 25.0},
                                 "models": {"det": {"version": "2", "requests": 20, "latency_ms": {"p50": 0.8, "p95": 1.0}}}})
    assert telemetry_point(light, 7.0) == TelemetryPoint("d1", 7.0, "det", 2, 0.8, 1.0, 25.0, None, 20, None)
    assert telemetry_point(Telemetry("d1"), 1.0) == TelemetryPoint("d1", 1.0)


def test_rates_from_request_counters() -> None:
    points = [TelemetryPoint("d", 0.0, "det", requests=0), TelemetryPoint("d", 2.0, "det", requests=20),
              TelemetryPoint("d", 4.0, "det", requests=5),  # the agent restarted: its counter began again
              TelemetryPoint("d", 5.0, "det", requests=15, rate_rps=7.0),  # the agent's own figure wins
              TelemetryPoint("d", 6.0, "seg", requests=30),  # another model: no rate across the change
              TelemetryPoint("d", 8.0, "seg", requests=34)]
    assert [p.rate_rps for p in with_rates(points)] == [None, 10.0, None, 7.0, None, 2.0]


def test_a_v2_sqlite_store_keeps_the_console_tables_it_already_had(tmp_path: Path) -> None:
    """edgectl before schema version 3 made users, tokens and packages itself in the SQLite file: they migrate in place."""
    path = tmp_path / "controller.db"
    SqliteStore(path).close()
    with sqlite3.connect(path) as db:  # back to version 2, with the tables and rows the old console code made
        db.executescript("""
            DELETE FROM schema_migrations WHERE version > 2; DROP TABLE users; DROP TABLE tokens; DROP TABLE packages;
            DROP TABLE telemetry_history; DROP INDEX latency_once; ALTER TABLE latency DROP COLUMN claimed;
            DROP INDEX devices_decommissioned; ALTER TABLE devices DROP COLUMN decommissioned;
            ALTER TABLE devices DROP COLUMN withdrawn; DROP TABLE device_groups;
            CREATE TABLE users(name TEXT PRIMARY KEY, role TEXT NOT NULL, created REAL);
            CREATE TABLE tokens(id TEXT PRIMARY KEY, user TEXT NOT NULL, name TEXT, sha256 TEXT NOT NULL, created REAL,
                                expires REAL, revoked REAL);
            CREATE TABLE packages(variant TEXT PRIMARY KEY, ref TEXT NOT NULL, uploaded REAL, actor TEXT);
            INSERT INTO users VALUES ('ann', 'admin', 1.0);
            INSERT INTO tokens VALUES ('t1', 'ann', 'laptop', 'abc', 2.0, NULL, NULL);
        """)
    store = SqliteStore(path)
    with sqlite3.connect(path) as db:
        assert [r[0] for r in db.execute("SELECT version FROM schema_migrations ORDER BY version")][-1] == LATEST
    assert store.users() == [UserRow("ann", Role.ADMIN, 1.0)]
    assert store.token("t1") == TokenRow("t1", "ann", "laptop", "abc", 2.0)
    assert store.remove_user("ann", 3.0) and (store.token("t1") or TokenRow("", "", "", "", 0)).revoked == 3.0
    store.add_telemetry(TelemetryPoint("d1", 1.0, cpu_percent=1.0))
    assert len(store.telemetry_history("d1")) == 1
    store.close()


@pytest.mark.parametrize("threads", [40])
def test_released_connections_are_reused_by_later_threads(store: Store, threads: int) -> None:
    """Each API connection runs in a thread of its own: released connections serve the next threads, so
    short-lived threads do not leave one open each (PostgreSQL would run out of connections)."""
    import threading

    def request() -> None:
        store.users()
        store.release()

    for _ in range(threads):
        t = threading.Thread(target=request)
        t.start()
        t.join()
    assert store.connections() <= 2  # the test's thread's and one reused one


def test_the_configured_retention_bounds_the_history(tmp_path: Path) -> None:
    from edgectl.config import ControllerSettings, RetentionSettings
    from edgectl.controller.store import open_configured

    settings = ControllerSettings(store=str(tmp_path / "c.db"), retention=RetentionSettings(telemetry_rows=7, max_age_days=2))
    store = open_configured(settings)
    assert (store.retention.telemetry_rows, store.retention.max_age_s) == (7, 2 * 86400.0)
    store.close()
