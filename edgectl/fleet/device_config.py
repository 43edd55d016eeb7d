"""Setting and showing a device's configuration on the controller store (the API and ``edgectl device config``).

Each set stores a whole new version of the device's settings (keys left out go back to its agent.yaml);
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
from edgectl.controller.store import Store

__all__ = ["ConfigInputError", "device_config_view", "set_device_config"]


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


def device_config_view(store: Store, device_id: str) -> dict[str, Any]:
    """Desired and reported configuration of a device, and whether they agree (``sync``)."""
    device = store.device(device_id)
    if device is None:
        raise NotFoundError(f"device {device_id!r} is not in the controller store")
    return {"device_id": device_id, **config_view(store.device_config(device_id),
                                                  device.state.config if device.state is not None else None)}
