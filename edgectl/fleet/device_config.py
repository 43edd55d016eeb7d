"""Setting and showing a device's configuration on the controller store (the API and ``edgectl device config``).

Each set stores a whole new version of the device's settings (keys left out go back to its agent.yaml),
for one device or for every device a group resolves to when it is set;
the settings are checked with the agent's own reader (edgecore/protocol/device_config.py), so what is
stored the agent takes. The running controller's engine leader signs and publishes it.
"""

from __future__ import annotations

import json
import time
from typing import Any

from edgecore.errors import NotFoundError, OperationFailed, ProtocolError, UserError
from edgecore.protocol.device_config import ConfigSettings
from edgectl.controller.device_config import DesiredConfig, config_view
from edgectl.controller.groups import resolve_group
from edgectl.controller.store import Store

__all__ = ["ConfigInputError", "device_config_view", "set_device_config", "set_group_config"]


class ConfigInputError(UserError):
    """Settings a configuration may not hold; ``field`` names the key (``settings.KEY``) at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def read_settings(data: Any) -> ConfigSettings:
    """The checked settings; ConfigInputError naming the key at fault."""
    try:
        return ConfigSettings.from_json(data)
    except ProtocolError as exc:
        message = str(exc)
        return _refuse(message.split(":", 1)[0] if message.startswith("settings") else "settings", message)


def _refuse(field: str, message: str) -> ConfigSettings:
    raise ConfigInputError(field, message)


def set_device_config(store: Store, device_id: str, data: Any, actor: str) -> DesiredConfig:
    """Store ``data`` as the device's next configuration version; audited. Nothing is stored for bad settings."""
    settings = read_settings(data)
    device = store.device(device_id)
    if device is None:
        raise NotFoundError(f"device {device_id!r} is not in the controller store")
    if device.decommissioned is not None:
        raise OperationFailed(f"device {device_id!r} is decommissioned: it takes no configuration")
    with store.batch():
        desired = store.put_device_config(device_id, settings, actor, time.time())
        store.audit("device config set", f"version {desired.version}: {json.dumps(settings.to_json())}", device_id=device_id,
                    actor=actor)
    return desired


def set_group_config(store: Store, name: str, data: Any, actor: str) -> list[DesiredConfig]:
    """Store ``data`` as the next configuration version of every device the group resolves to now (decommissioned ones
    left out), in one transaction, each audited; nothing is stored for bad settings or a group of no device."""
    settings = read_settings(data)
    group = store.group(name)
    if group is None:
        raise NotFoundError(f"no device group {name!r} (see `edgectl group list`)")
    devices = [d for d in resolve_group(group, store.devices()) if d.decommissioned is None]
    if not devices:
        raise UserError(f"group {name!r} resolves to no device now: nothing to configure")
    said = json.dumps(settings.to_json())
    with store.batch():
        stored = [store.put_device_config(d.id, settings, actor, time.time()) for d in devices]
        for desired in stored:
            store.audit("device config set", f"version {desired.version} (group {name}): {said}",
                        device_id=desired.device_id, actor=actor)
    return stored


def device_config_view(store: Store, device_id: str) -> dict[str, Any]:
    """Desired and reported configuration of a device, and whether they agree (``sync``)."""
    device = store.device(device_id)
    if device is None:
        raise NotFoundError(f"device {device_id!r} is not in the controller store")
    return {"device_id": device_id, **config_view(store.device_config(device_id),
                                                  device.state.config if device.state is not None else None)}
