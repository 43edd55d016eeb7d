"""The controller's store: devices, telemetry history, rollouts, per-device rollout rows, audit log,
and the console's users, tokens and uploaded packages.

:class:`Store` (``protocol.py``, which extends :class:`ConsoleStore`) is the whole interface the
controller, the fleet domain layer, the CLI and the REST API use. :func:`open_url` picks the back-end from a URL:

- a path, or ``sqlite:///relative/file.db`` / ``sqlite:////absolute/file.db`` (SQLAlchemy's form):
  :class:`SqliteStore`, the default, one controller;
- ``postgresql://user@host:port/db`` (any libpq connection string): :class:`PostgresStore`, several
  controller replicas with one engine leader (:mod:`edgectl.controller.leader`).

Both migrate their schema on open (``migrations.py``) and keep telemetry history within a
:class:`Retention`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from edgecore.errors import ConfigError
from edgectl.controller.records import DeviceRecord, RolloutDevice, RolloutRow
from edgectl.controller.store.migrations import LATEST
from edgectl.controller.store.protocol import DAY_S, ConsoleStore, Fenced, Lease, LeaseToken, Retention, Store, StoreUnavailable
from edgectl.controller.store.sqlite import SqliteStore

if TYPE_CHECKING:
    from edgectl.config import ControllerSettings

__all__ = ["LATEST", "ConsoleStore", "DeviceRecord", "Fenced", "Lease", "LeaseToken", "Retention", "RolloutDevice", "RolloutRow",
           "SqliteStore", "Store", "StoreUnavailable", "is_url", "open_configured", "open_url", "sqlite_path"]

POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def is_url(value: str) -> bool:
    return "://" in value


def sqlite_path(value: str) -> Path | None:
    """The file of a SQLite store (a path or ``sqlite:///...``); None for another engine's URL."""
    if value.startswith("sqlite:///"):
        return Path(value[len("sqlite:///"):])
    if value.startswith(POSTGRES_SCHEMES):
        return None
    if is_url(value):
        scheme = value.split("://", 1)[0]
        raise ConfigError(f"controller.store: unknown store URL scheme {scheme!r} (use a path, sqlite:///PATH or postgresql://...)")
    return Path(value)


def open_url(url: str, retention: Retention | None = None, packages_dir: Path | None = None) -> Store:
    """The store at ``url``, migrated to this edgectl's schema. ``packages_dir``: the PostgreSQL store's package cache."""
    path = sqlite_path(url)
    if path is not None:
        return SqliteStore(path, retention)
    from edgectl.controller.store.postgres import PostgresStore

    if packages_dir is None:
        from edgectl.home import edgectl_home

        packages_dir = edgectl_home() / "packages"
    return PostgresStore(url, packages_dir, retention)


def open_configured(settings: ControllerSettings) -> Store:
    """The store the config names (``controller.store``, ``controller.retention``)."""
    keep = settings.retention
    return open_url(settings.store_url(), Retention(keep.latency_rows, keep.events, keep.max_age_days * DAY_S,
                                                    telemetry_rows=keep.telemetry_rows))
