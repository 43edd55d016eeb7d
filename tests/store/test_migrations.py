"""Schema migrations: a store written by edgectl 0.1 migrates in place; a newer one is refused."""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path

import pytest

from edgecore.errors import ConfigError
from edgecore.protocol.reports import DeviceState
from edgectl.controller.records import DeviceStatus, RolloutStatus
from edgectl.controller.store import LATEST, SqliteStore, open_url
from tests.store.conftest import MakeStore

# The DDL edgectl 0.1 ran (edgectl/controller/store.py at 471a83b), copied here on purpose: the test
# must not follow the migrations module if someone edits a released step.
SCHEMA_0_1 = """
CREATE TABLE IF NOT EXISTS devices(
    id TEXT PRIMARY KEY, online INTEGER, last_seen REAL, birth TEXT, state TEXT,
    telemetry TEXT, telemetry_ts REAL);
CREATE TABLE IF NOT EXISTS latency(
    device_id TEXT, ts REAL, model TEXT, version INTEGER, p95_ms REAL, source TEXT);
CREATE INDEX IF NOT EXISTS latency_device ON latency(device_id, model, version, ts);
CREATE TABLE IF NOT EXISTS events(
    device_id TEXT, ts REAL, deployment_id TEXT, state TEXT, status TEXT, detail TEXT, data TEXT);
CREATE INDEX IF NOT EXISTS events_device ON events(device_id, ts);
CREATE TABLE IF NOT EXISTS rollouts(
    id TEXT PRIMARY KEY, created REAL, status TEXT, spec TEXT, wave INTEGER, phase TEXT,
    phase_since REAL, reason TEXT, updated REAL);
CREATE TABLE IF NOT EXISTS rollout_devices(
    rollout_id TEXT, device_id TEXT, wave INTEGER, variant TEXT, status TEXT, state TEXT,
    detail TEXT, data TEXT, desired BLOB, previous TEXT, installed_at REAL, updated REAL,
    PRIMARY KEY(rollout_id, device_id));
CREATE INDEX IF NOT EXISTS rollout_devices_device ON rollout_devices(device_id);
CREATE TABLE IF NOT EXISTS audit(
    id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL, actor TEXT, rollout_id TEXT, device_id TEXT,
    action TEXT, detail TEXT);
CREATE TABLE IF NOT EXISTS requests(
    id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL, rollout_id TEXT, action TEXT, done INTEGER DEFAULT 0);
"""

SPEC_0_1 = {"selector": "all", "packages": [{"variant": "v1", "artifact_id": "a1", "name": "tiny", "version": 2,
                                             "target": "any", "label": "tiny@2", "path": "/p", "size": 9}],
            "wave_count": 1, "max_failure": 0.05, "bake_s": 0, "gates": [], "silence_s": 60}


def old_store(path: Path) -> None:
    db = sqlite3.connect(path)
    db.executescript(SCHEMA_0_1)
    # Reports as 0.1 kept them: the JSON the device sent. The telemetry is one no reader takes (no device id).
    birth, state = '{"schema":1,"device_id":"d1","target":"cpu-x86"}', '{"schema":1,"device_id":"d1","last_seq":3}'
    db.execute("INSERT INTO devices VALUES ('d1', 1, 10.0, ?, ?, '{\"n\":2}', 9.0)", (birth, state))
    db.executemany("INSERT INTO events VALUES (?,?,?,?,?,?,?)", [("d1", 5.0, "r-1", "done", "ok", "", "{}")] * 2)  # a redelivery
    db.execute("INSERT INTO latency VALUES ('d1', 5.0, 'tiny', 2, 7.5, 'health')")
    db.execute("INSERT INTO rollouts VALUES ('r-1', 1.0, 'done', ?, 1, 'baking', 2.0, 'every wave promoted', 3.0)",
               (json.dumps(SPEC_0_1),))
    db.execute("INSERT INTO rollout_devices VALUES ('r-1','d1',1,'v1','ok','done','','{}',?,'{}',4.0,5.0)", (b"signed",))
    db.execute("INSERT INTO audit(ts, actor, rollout_id, device_id, action, detail) "
               "VALUES (1, 'operator', 'r-1', '', 'created', '')")
    db.commit()
    db.close()


def versions(path: Path) -> list[int]:
    with sqlite3.connect(path) as db:
        return [r[0] for r in db.execute("SELECT version FROM schema_migrations ORDER BY version")]


def test_a_0_1_sqlite_store_migrates_in_place_and_keeps_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "controller.db"
    old_store(path)
    store = SqliteStore(path)
    assert versions(path) == list(range(1, LATEST + 1))
    device = store.device("d1")
    assert device is not None and device.birth is not None and device.birth.target == "cpu-x86" and device.last_seq == 3
    assert device.telemetry is None and device.telemetry_ts == 9.0  # a kept report that does not read is left out
    rollout = store.rollout("r-1")
    assert rollout is not None and rollout.status == RolloutStatus.DONE and rollout.spec.max_per_minute == 0
    row = store.rollout_devices("r-1")[0]
    assert (row.status, row.desired) == (DeviceStatus.OK, b"signed")
    assert [e.status for e in store.events("d1")] == ["ok"]  # the redelivered copy went
    assert store.unclaimed_events() == []  # 0.1 applied its events as they came
    assert store.latency("d1")[0].p95_ms == 7.5
    assert [a.action for a in store.audit_log()] == ["created"]
    # the new columns work on the migrated file
    for seq, at in ((2, 1.0), (4, 2.0), (1, 1.5)):
        store.upsert_device("d1", state=DeviceState("d1", last_seq=seq), state_at=at)
    assert (store.device("d1") or device).last_seq == 4
    store.close()
    SqliteStore(path).close()  # opening again applies nothing more
    assert versions(path) == list(range(1, LATEST + 1))


def test_a_store_newer_than_this_edgectl_is_refused(store_url: str, make_store: MakeStore) -> None:
    make_store().close()
    if store_url.startswith("postgresql"):
        import psycopg

        with psycopg.connect(store_url, autocommit=True) as conn:
            conn.execute("INSERT INTO schema_migrations(version, name) VALUES (99, 'future')")
    else:
        with sqlite3.connect(store_url) as db:
            db.execute("INSERT INTO schema_migrations(version, name) VALUES (99, 'future')")
    with pytest.raises(ConfigError, match=f"schema version 99; this edgectl knows up to {LATEST}: upgrade edgectl"):
        make_store()


def test_replicas_starting_together_migrate_once(store_url: str) -> None:
    errors: list[BaseException] = []

    def start() -> None:
        try:
            open_url(store_url).close()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    store = open_url(store_url)
    with store.batch():
        store.audit("ok")
    store.close()


def test_unknown_store_url_is_one_line() -> None:
    with pytest.raises(ConfigError, match="unknown store URL scheme 'mysql'"):
        open_url("mysql://x/y")
