"""The fleet's devices (the broker's retained messages plus the controller store) and the store itself."""

from __future__ import annotations

import queue
from dataclasses import replace
from typing import Any

from edgecore.errors import NotFoundError, UserError
from edgecore.transport import Message
from edgectl.config import EdgectlConfig
from edgectl.connection import open_transport
from edgectl.controller.ingest import collect_devices
from edgectl.controller.queries import DeviceQuery
from edgectl.controller.records import DeviceRecord
from edgectl.controller.selector import FIELDS
from edgectl.controller.store import Store, open_configured
from edgectl.fleet.groups import device_chooser

__all__ = ["device_detail", "device_page", "fleet_devices", "fleet_records", "fleet_summary", "open_store", "store_devices",
           "store_records"]


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
    return [r.to_dict() for r in fleet_records(broker, config, selector)]


def fleet_records(broker: str | None, config: EdgectlConfig, selector: str) -> list[DeviceRecord]:
    """:func:`fleet_devices` as records (births and states read), for planning; ``group:NAME`` is a group of the store."""
    store = open_store(config) if _store_exists(config) else None
    choose = device_chooser(store, selector)
    inbox: queue.Queue[Message] = queue.Queue()
    transport = open_transport(broker, config, inbox)
    try:
        records = collect_devices(transport, inbox)
    finally:
        transport.close()
    if store is not None:  # the broker's retained reports are newer; the store adds devices and telemetry times
        for kept in store.devices():
            heard = records.get(kept.id)
            records[kept.id] = kept if heard is None else _merged(heard, kept)
        for gone in store.decommissioned_ids():  # its retained reports stay on the broker; it is no fleet member
            records.pop(gone, None)
    return choose([r for _, r in sorted(records.items())])


def _merged(heard: DeviceRecord, kept: DeviceRecord) -> DeviceRecord:
    """What the broker holds, each report the broker did not hand over (yet) taken from the store."""
    return replace(heard, telemetry=kept.telemetry, telemetry_ts=kept.telemetry_ts,
                   online=kept.online if heard.online is None else heard.online,
                   last_seen=heard.last_seen or kept.last_seen,
                   birth=heard.birth or kept.birth, state=heard.state or kept.state)


def device_detail(store: Store, device_id: str) -> dict[str, Any]:
    """One device: registry record, hardware, telemetry, recent events, latency history, audit entries."""
    row = store.device(device_id)
    if row is None:
        raise NotFoundError(f"device {device_id!r} is not in the controller store (is `edgectl controller run` running?)")
    return {**row.to_dict(), "hardware": row.birth.hardware if row.birth else None,
            "telemetry": row.telemetry.to_json() if row.telemetry else {},
            "events": [e.to_dict() for e in store.events(device_id)],
            "latency": [p.to_dict() for p in store.latency(device_id, limit=200)],
            "audit": [a.to_dict() for a in store.audit_log(device_id=device_id, limit=50)]}


def store_devices(store: Store, selector: str) -> list[dict[str, Any]]:
    """Devices from the controller store (what it ingested from the broker), filtered by ``selector``."""
    return [r.to_dict() for r in store_records(store, selector)]


def store_records(store: Store, selector: str) -> list[DeviceRecord]:
    """:func:`store_devices` as records, for planning."""
    return device_chooser(store, selector)(store.devices())


def device_page(store: Store, query: DeviceQuery) -> dict[str, Any]:
    """One page of the store's devices matching ``query``, with the total; a selector key that is neither
    a field nor any device's tag is a UserError, as with ``edgectl devices --selector``."""
    page = store.device_page(query)
    if page.total == 0:
        tags = store.device_tag_keys()
        unknown = [k for k, _ in query.terms if k not in FIELDS and k not in tags]
        if unknown:
            raise UserError(f"selector: unknown key {unknown[0]!r} (known: {', '.join([*FIELDS, *sorted(tags)])})")
    return {"total": page.total, "limit": query.limit, "offset": query.offset, "devices": [r.to_dict() for r in page.rows]}


def fleet_summary(store: Store) -> dict[str, Any]:
    """Device counts: total, by presence, by target, by active model (``name@version``, ``none``)."""
    by_status: dict[str, int] = {}
    by_target: dict[str, int] = {}
    for (target, status), n in store.device_counts().items():
        by_status[status] = by_status.get(status, 0) + n
        by_target[target or "unknown"] = by_target.get(target or "unknown", 0) + n
    by_model = {f"{name}@{version}" if name else "none": n for (name, version), n in store.device_models().items()}
    return {"total": sum(by_status.values()), "by_status": by_status, "by_target": by_target, "by_model": by_model}

