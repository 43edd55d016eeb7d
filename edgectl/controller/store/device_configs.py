"""Desired device configurations (``device_configs``, migration 13), written once for both engines."""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

from edgecore.protocol.device_config import ConfigSettings
from edgectl.controller.device_config import DesiredConfig

__all__ = ["ConfigSql"]

# The next version in one statement: two operators setting the same device at once get two versions, never one twice.
PUT = ("INSERT INTO device_configs(device_id, version, settings, updated_by, updated_at, published) VALUES (?, 1, ?, ?, ?, 0) "
       "ON CONFLICT(device_id) DO UPDATE SET version=device_configs.version+1, settings=excluded.settings, "
       "updated_by=excluded.updated_by, updated_at=excluded.updated_at")


class ConfigSql:
    """Configuration rows; a back-end supplies ``_execute``, ``_all`` and ``batch``."""

    def _execute(self, sql: str, args: Sequence[Any] = (), at_once: bool = False) -> Any:
        raise NotImplementedError

    def _all(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        raise NotImplementedError

    def batch(self) -> AbstractContextManager[None]:
        raise NotImplementedError

    def put_device_config(self, device_id: str, settings: ConfigSettings, actor: str, at: float) -> DesiredConfig:
        with self.batch():
            self._execute(PUT, (device_id, json.dumps(settings.to_json()), actor, at))
            return DesiredConfig.from_columns(self._all("SELECT * FROM device_configs WHERE device_id=?", (device_id,))[0])

    def device_config(self, device_id: str) -> DesiredConfig | None:
        rows = self._all("SELECT * FROM device_configs WHERE device_id=?", (device_id,))
        return DesiredConfig.from_columns(rows[0]) if rows else None

    def device_configs(self, unpublished: bool = False) -> list[DesiredConfig]:
        where = " WHERE published < version" if unpublished else ""
        return [DesiredConfig.from_columns(r) for r in self._all(f"SELECT * FROM device_configs{where} ORDER BY device_id")]

    def mark_config_published(self, device_id: str, version: int) -> None:
        self._execute("UPDATE device_configs SET published=? WHERE device_id=? AND published < ?", (version, device_id, version))
