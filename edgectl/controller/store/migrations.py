"""Numbered schema migrations, one list for both engines (each step has SQLite and PostgreSQL text).

``schema_migrations`` records each applied step. A SQLite file written by edgectl 0.1 (its tables,
no ``schema_migrations``) is version 1 and migrates in place, rows kept. A store newer than this
edgectl is refused, naming both versions. Migrations run in one transaction under a lock
(SQLite ``BEGIN IMMEDIATE``, a PostgreSQL advisory transaction lock), so replicas starting together
migrate once. Never edit a released step: add the next one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from edgecore.errors import ConfigError

__all__ = ["LATEST", "MIGRATIONS", "Migration", "migrate"]

MIGRATE_LOCK = 0x65646765637401  # pg_advisory_xact_lock key while migrating ("edgect" + 1)


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sqlite: str
    postgres: str


# Version 1 is the schema edgectl 0.1 created (SQLite only); PostgreSQL gets the same tables with
# a serial id on the append-only ones (SQLite has its rowid).
V1_SQLITE = """
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

V1_POSTGRES = """
CREATE TABLE IF NOT EXISTS devices(
    id TEXT PRIMARY KEY, online INTEGER, last_seen DOUBLE PRECISION, birth TEXT, state TEXT,
    telemetry TEXT, telemetry_ts DOUBLE PRECISION);
CREATE TABLE IF NOT EXISTS latency(
    id BIGSERIAL PRIMARY KEY, device_id TEXT, ts DOUBLE PRECISION, model TEXT, version INTEGER,
    p95_ms DOUBLE PRECISION, source TEXT);
CREATE INDEX IF NOT EXISTS latency_device ON latency(device_id, model, version, ts);
CREATE TABLE IF NOT EXISTS events(
    id BIGSERIAL PRIMARY KEY, device_id TEXT, ts DOUBLE PRECISION, deployment_id TEXT, state TEXT,
    status TEXT, detail TEXT, data TEXT);
CREATE INDEX IF NOT EXISTS events_device ON events(device_id, ts);
CREATE TABLE IF NOT EXISTS rollouts(
    id TEXT PRIMARY KEY, created DOUBLE PRECISION, status TEXT, spec TEXT, wave INTEGER, phase TEXT,
    phase_since DOUBLE PRECISION, reason TEXT, updated DOUBLE PRECISION);
CREATE TABLE IF NOT EXISTS rollout_devices(
    rollout_id TEXT, device_id TEXT, wave INTEGER, variant TEXT, status TEXT, state TEXT,
    detail TEXT, data TEXT, desired BYTEA, previous TEXT, installed_at DOUBLE PRECISION,
    updated DOUBLE PRECISION, PRIMARY KEY(rollout_id, device_id));
CREATE INDEX IF NOT EXISTS rollout_devices_device ON rollout_devices(device_id);
CREATE TABLE IF NOT EXISTS audit(
    id BIGSERIAL PRIMARY KEY, ts DOUBLE PRECISION, actor TEXT, rollout_id TEXT, device_id TEXT,
    action TEXT, detail TEXT);
CREATE TABLE IF NOT EXISTS requests(
    id BIGSERIAL PRIMARY KEY, ts DOUBLE PRECISION, rollout_id TEXT, action TEXT, done INTEGER DEFAULT 0);
CREATE TABLE IF NOT EXISTS package_files(variant TEXT PRIMARY KEY, data BYTEA, size BIGINT);
"""

# Version 2: the device's own time of each kept report (order-tolerant upserts), events kept once
# and marked when an engine leader applied them, indexes for retention.
V2 = """
ALTER TABLE devices ADD COLUMN presence_at {real};
ALTER TABLE devices ADD COLUMN birth_at {real};
ALTER TABLE devices ADD COLUMN state_at {real};
ALTER TABLE devices ADD COLUMN telemetry_at {real};
ALTER TABLE events ADD COLUMN claimed INTEGER DEFAULT 1;
{dedupe}
CREATE UNIQUE INDEX IF NOT EXISTS events_once ON events(device_id, ts, deployment_id, state, status);
CREATE INDEX IF NOT EXISTS events_unclaimed ON events(claimed, ts);
CREATE INDEX IF NOT EXISTS latency_age ON latency(device_id, ts);
"""
DEDUPE_SQLITE = ("DELETE FROM events WHERE rowid NOT IN "
                 "(SELECT MIN(rowid) FROM events GROUP BY device_id, ts, deployment_id, state, status);")

# Version 3: the console's users, tokens (hashes only) and uploaded packages. edgectl before this
# version made these tables itself in SQLite files the API had served (the same columns): IF NOT
# EXISTS keeps them and their rows. "user" is quoted: PostgreSQL reserves the word.
V3 = """
CREATE TABLE IF NOT EXISTS users(name TEXT PRIMARY KEY, role TEXT NOT NULL, created {real});
CREATE TABLE IF NOT EXISTS tokens(
    id TEXT PRIMARY KEY, "user" TEXT NOT NULL, name TEXT, sha256 TEXT NOT NULL, created {real}, expires {real},
    revoked {real});
CREATE INDEX IF NOT EXISTS tokens_user ON tokens("user");
CREATE TABLE IF NOT EXISTS packages(variant TEXT PRIMARY KEY, ref TEXT NOT NULL, uploaded {real}, actor TEXT);
"""

# Version 4: each device's telemetry history (the console's device charts), bounded by the retention.
V4 = """
CREATE TABLE IF NOT EXISTS telemetry_history(
    {id}device_id TEXT, ts {real}, model TEXT, version INTEGER, p50_ms {real}, p95_ms {real},
    cpu_percent {real}, memory_percent {real}, requests BIGINT, rate_rps {real});
CREATE INDEX IF NOT EXISTS telemetry_history_device ON telemetry_history(device_id, ts);
"""
# Version 5: the engine lease of replicated controllers (PostgreSQL only; SQLite's is a file lock).
# ``expires`` is on the database's clock; ``epoch`` is the fencing number every leader write
# carries; ``holder_pid`` is the holder's backend, whose end frees the lease before it expires.
V5_POSTGRES = """
CREATE TABLE IF NOT EXISTS leases(
    name TEXT PRIMARY KEY, holder TEXT NOT NULL DEFAULT '', epoch BIGINT NOT NULL DEFAULT 0,
    expires DOUBLE PRECISION NOT NULL DEFAULT 0, holder_pid INTEGER);
INSERT INTO leases(name) VALUES ('engine') ON CONFLICT DO NOTHING;
"""
# Version 6: what each device serves, one row per model or pipeline (store/served.py), made from the states
# already kept: their ``models`` list, or for states of agents from before sets their one ``active`` model.
V6 = """
CREATE TABLE IF NOT EXISTS device_models(
    device_id TEXT NOT NULL, name TEXT NOT NULL, version BIGINT, kind TEXT, backend TEXT, artifact_id TEXT,
    deployment_id TEXT, footprint_mb {real}, PRIMARY KEY(device_id, name));
CREATE INDEX IF NOT EXISTS device_models_name ON device_models(name, version);
"""
V6_SQLITE = V6.format(real="REAL") + """
INSERT OR IGNORE INTO device_models(device_id, name, version, kind, backend, artifact_id, deployment_id, footprint_mb)
    SELECT d.id, json_extract(m.value, '$.name'), CAST(json_extract(m.value, '$.version') AS INTEGER),
           COALESCE(json_extract(m.value, '$.kind'), 'model'), json_extract(m.value, '$.backend'),
           json_extract(m.value, '$.artifact_id'), json_extract(m.value, '$.deployment_id'),
           json_extract(m.value, '$.footprint_mb')
    FROM devices d, json_each(CASE WHEN json_valid(d.state) THEN d.state ELSE '{}' END, '$.models') m
    WHERE json_type(m.value, '$.name') = 'text';
INSERT OR IGNORE INTO device_models(device_id, name, version, kind, backend, artifact_id)
    SELECT d.id, json_extract(d.state, '$.active.name'), CAST(json_extract(d.state, '$.active.version') AS INTEGER),
           'model', json_extract(d.state, '$.active.backend'), json_extract(d.state, '$.active.artifact_id')
    FROM devices d
    WHERE json_valid(d.state) AND json_type(d.state, '$.active.name') = 'text'
      AND COALESCE(json_type(d.state, '$.models'), 'null') = 'null';
"""
V6_POSTGRES = V6.format(real="DOUBLE PRECISION") + """
INSERT INTO device_models(device_id, name, version, kind, backend, artifact_id, deployment_id, footprint_mb)
    SELECT d.id, m->>'name', (m->>'version')::BIGINT, COALESCE(m->>'kind', 'model'), m->>'backend', m->>'artifact_id',
           m->>'deployment_id', (m->>'footprint_mb')::DOUBLE PRECISION
    FROM devices d CROSS JOIN LATERAL jsonb_array_elements(
        CASE WHEN jsonb_typeof(d.state::jsonb->'models') = 'array' THEN d.state::jsonb->'models' ELSE '[]'::jsonb END) m
    WHERE COALESCE(d.state, '') <> '' AND jsonb_typeof(m->'name') = 'string'
    ON CONFLICT DO NOTHING;
INSERT INTO device_models(device_id, name, version, kind, backend, artifact_id)
    SELECT d.id, d.state::jsonb#>>'{active,name}', (d.state::jsonb#>>'{active,version}')::BIGINT, 'model',
           d.state::jsonb#>>'{active,backend}', d.state::jsonb#>>'{active,artifact_id}'
    FROM devices d
    WHERE COALESCE(d.state, '') <> '' AND jsonb_typeof(d.state::jsonb#>'{active,name}') = 'string'
      AND COALESCE(jsonb_typeof(d.state::jsonb->'models'), 'null') = 'null'
    ON CONFLICT DO NOTHING;
"""
# Version 7: the time the device claimed for the report each telemetry point and latency figure came from
# (``Telemetry.ts``), unique per device and model: replicas that each receive every report (a broker without
# shared subscriptions: NATS) keep one row of it, whichever stores it first. Rows kept before, and figures of
# reports that claim no time, have none: NULLs are never equal, so those are all kept.
V7 = """
ALTER TABLE telemetry_history ADD COLUMN claimed {real};
ALTER TABLE latency ADD COLUMN claimed {real};
CREATE UNIQUE INDEX IF NOT EXISTS telemetry_history_once ON telemetry_history(device_id, model, claimed);
CREATE UNIQUE INDEX IF NOT EXISTS latency_once ON latency(device_id, model, claimed);
"""
# Version 8: server-side device groups (edgectl/controller/groups.py), set by operators: a static group's members
# (a JSON array of device ids) or a dynamic group's selector.
V8 = """
CREATE TABLE IF NOT EXISTS device_groups(
    name TEXT PRIMARY KEY, kind TEXT NOT NULL, members TEXT NOT NULL DEFAULT '[]', query TEXT NOT NULL DEFAULT '',
    description TEXT NOT NULL DEFAULT '', created_by TEXT NOT NULL DEFAULT '', created_at {real}, updated_at {real});
"""
# Version 9: webhook subscriptions and their deliveries (controller/webhooks.py). A delivery row is made in the
# transaction of the audit entry it reports, so a controller that stops before sending it sends it after its restart;
# ``claimed_by``/``claimed_until`` keep two replicas from sending the same attempt. The secret signs each delivery,
# so it is kept as given (never answered by the API).
V9 = """
CREATE TABLE IF NOT EXISTS webhooks(
    id TEXT PRIMARY KEY, url TEXT NOT NULL, events TEXT NOT NULL, secret TEXT NOT NULL, created_by TEXT,
    created_at {real}, enabled INTEGER NOT NULL DEFAULT 1);
CREATE TABLE IF NOT EXISTS webhook_deliveries(
    id TEXT PRIMARY KEY, webhook_id TEXT NOT NULL, event_id TEXT NOT NULL, event TEXT NOT NULL, payload TEXT NOT NULL,
    created_at {real}, status TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, status_code INTEGER, error TEXT,
    next_attempt {real}, last_attempt {real}, delivered_at {real}, claimed_by TEXT, claimed_until {real});
CREATE INDEX IF NOT EXISTS webhook_deliveries_due ON webhook_deliveries(status, next_attempt);
CREATE INDEX IF NOT EXISTS webhook_deliveries_hook ON webhook_deliveries(webhook_id, created_at);
"""
# Version 10: decommissioned devices (edgectl/fleet/lifecycle.py): when an operator took the device out of the fleet
# (kept for history, left out of every fleet query) and when the controller cleared its retained desired state on the
# broker; the ids of deleted ones (a report under one registers no device again); indexes for the audit log's filters.
V10 = """
ALTER TABLE devices ADD COLUMN decommissioned {real};
ALTER TABLE devices ADD COLUMN withdrawn {real};
CREATE INDEX IF NOT EXISTS devices_decommissioned ON devices(decommissioned);
CREATE TABLE IF NOT EXISTS deleted_devices(id TEXT PRIMARY KEY, decommissioned {real}, deleted {real});
CREATE INDEX IF NOT EXISTS audit_ts ON audit(ts);
CREATE INDEX IF NOT EXISTS audit_device ON audit(device_id, ts);
CREATE INDEX IF NOT EXISTS audit_rollout ON audit(rollout_id, ts);
"""
# Version 11: protected device groups: a rollout to one waits for a second operator's approval (edgectl/fleet/approvals.py).
V11 = """
ALTER TABLE device_groups ADD COLUMN protected INTEGER NOT NULL DEFAULT 0;
"""
# Version 12: remote log requests and their answers (edgectl/controller/logs.py): stored so that the replica that takes an
# operator's request, the leader that sends it and the replica that receives the device's answer may all differ.
V12 = """
CREATE TABLE IF NOT EXISTS log_requests(
    request_id TEXT PRIMARY KEY, device_id TEXT NOT NULL, query TEXT NOT NULL, actor TEXT, asked {real} NOT NULL,
    sent {real}, answered {real}, answer TEXT);
CREATE INDEX IF NOT EXISTS log_requests_device ON log_requests(device_id, asked);
CREATE INDEX IF NOT EXISTS log_requests_unsent ON log_requests(sent, asked);
"""
# Version 13: each device's desired configuration (edgectl/controller/device_config.py): its version, the settings, who set
# it, and the version the engine leader last published retained (``published < version``: due).
V13 = """
CREATE TABLE IF NOT EXISTS device_configs(
    device_id TEXT PRIMARY KEY, version INTEGER NOT NULL, settings TEXT NOT NULL, updated_by TEXT, updated_at {real},
    published INTEGER NOT NULL DEFAULT 0);
"""
# Version 14: maintenance windows of device groups (edgecore/windows.py), a JSON array of window texts.
V14 = """
ALTER TABLE device_groups ADD COLUMN windows TEXT NOT NULL DEFAULT '[]';
"""
SQLITE = {"real": "REAL", "id": ""}
POSTGRES = {"real": "DOUBLE PRECISION", "id": "id BIGSERIAL PRIMARY KEY, "}

MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "the edgectl 0.1 schema", V1_SQLITE, V1_POSTGRES),
    Migration(2, "report times, events once, retention indexes",
              V2.format(real="REAL", dedupe=DEDUPE_SQLITE), V2.format(real="DOUBLE PRECISION", dedupe="")),
    Migration(3, "console users, tokens and uploaded packages", V3.format(**SQLITE), V3.format(**POSTGRES)),
    Migration(4, "telemetry history", V4.format(**SQLITE), V4.format(**POSTGRES)),
    Migration(5, "the engine lease (PostgreSQL)", "", V5_POSTGRES),
    Migration(6, "what each device serves, one row per model", V6_SQLITE, V6_POSTGRES),
    Migration(7, "telemetry points and latency figures once per report", V7.format(**SQLITE), V7.format(**POSTGRES)),
    Migration(8, "server-side device groups", V8.format(**SQLITE), V8.format(**POSTGRES)),
    Migration(9, "webhooks and their deliveries", V9.format(**SQLITE), V9.format(**POSTGRES)),
    Migration(10, "decommissioned devices, audit log indexes", V10.format(**SQLITE), V10.format(**POSTGRES)),
    Migration(11, "protected device groups", V11, V11),
    Migration(12, "remote log requests and answers", V12.format(**SQLITE), V12.format(**POSTGRES)),
    Migration(13, "desired device configurations", V13.format(**SQLITE), V13.format(**POSTGRES)),
    Migration(14, "maintenance windows of device groups", V14, V14),
)
LATEST = MIGRATIONS[-1].version

Execute = Callable[[str, Sequence[Any]], list[Any]]


def statements(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]


def migrate(execute: Execute, dialect: str, where: str) -> tuple[int, int]:
    """Bring the schema to :data:`LATEST` inside the caller's locked transaction; return (before, after)."""
    execute("CREATE TABLE IF NOT EXISTS schema_migrations(version INTEGER PRIMARY KEY, name TEXT, applied "
            + ("REAL" if dialect == "sqlite" else "DOUBLE PRECISION") + ")", ())
    rows = execute("SELECT MAX(version) AS v FROM schema_migrations", ())
    current = rows[0]["v"] if rows and rows[0]["v"] is not None else _unversioned(execute, dialect)
    if current > LATEST:
        raise ConfigError(f"store {where} has schema version {current}; this edgectl knows up to {LATEST}: upgrade edgectl")
    for step in MIGRATIONS[current:]:
        for sql in statements(step.sqlite if dialect == "sqlite" else step.postgres):
            execute(sql, ())
        execute("INSERT INTO schema_migrations(version, name, applied) VALUES (?, ?, ?)", (step.version, step.name, time.time()))
    return current, LATEST


def _unversioned(execute: Execute, dialect: str) -> int:
    """0 for an empty store; 1 for tables edgectl 0.1 made before migrations were recorded."""
    if dialect == "sqlite":
        found = execute("SELECT name FROM sqlite_master WHERE type='table' AND name='devices'", ())
    else:
        found = execute("SELECT tablename FROM pg_tables WHERE schemaname=current_schema() AND tablename='devices'", ())
    if not found:
        return 0
    execute("INSERT INTO schema_migrations(version, name, applied) VALUES (?, ?, ?)",
            (1, MIGRATIONS[0].name + " (found in place)", time.time()))
    return 1
