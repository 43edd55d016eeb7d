"""The fleet's devices (the broker's retained messages plus the controller store) and the store itself."""

from __future__ import annotations

import queue
from typing import Any

from agent.errors import NotFoundError
from agent.transport import Message
from edgectl.config import EdgectlConfig
from edgectl.connection import open_transport
from edgectl.controller.selector import parse_selector
from edgectl.controller.store import Store, open_configured
from edgectl.registry import DeviceRecord, collect_devices

__all__ = ["device_detail", "fleet_devices", "open_store"]


def open_store(config: EdgectlConfig, must_exist: bool = True) -> Store:
    """The store named by the config's ``controller.store`` (default $EDGECTL_HOME/controller.db)."""
    path = config.controller.store_path()  # None: a database server, which exists or says why not
    if must_exist and path is not None and not path.exists():
        raise NotFoundError(f"no controller store at {path}: deploy with --fleet first")
    return open_configured(config.controller)


def _store_exists(config: EdgectlConfig) -> bool:
    path = config.controller.store_path()
    return path is None or path.exists()


def fleet_devices(broker: str | None, config: EdgectlConfig, selector: str) -> list[dict[str, Any]]:
    """Devices from the broker's retained messages (plus the controller store's), filtered by ``selector``."""
    chosen = parse_selector(selector)
    inbox: queue.Queue[Message] = queue.Queue()
    transport = open_transport(broker, config, inbox)
    try:
        records = collect_devices(transport, inbox)
    finally:
        transport.close()
    telemetry: dict[str, float | None] = {}
    if _store_exists(config):
        for row in open_store(config).devices():
            records.setdefault(row.id, DeviceRecord.from_row(row))
            telemetry[row.id] = row.telemetry_ts
    rows = [r.to_dict() for _, r in sorted(records.items())]
    for r in rows:
        r["last_telemetry"] = telemetry.get(r["device_id"])
    chosen.check_keys(rows)
    return [r for r in rows if chosen.matches(r)]


def device_detail(store: Store, device_id: str) -> dict[str, Any]:
    """One device: registry record, hardware, telemetry, recent events, latency history, audit entries."""
    row = store.device(device_id)
    if row is None:
        raise NotFoundError(f"device {device_id!r} is not in the controller store (is `edgectl controller run` running?)")
    return {**DeviceRecord.from_row(row).to_dict(), "hardware": row.birth.get("hardware"), "telemetry": row.telemetry,
            "events": [e.to_dict() for e in store.events(device_id)],
            "latency": [p.to_dict() for p in store.latency(device_id, limit=200)],
            "audit": [a.to_dict() for a in store.audit_log(device_id=device_id, limit=50)]}
