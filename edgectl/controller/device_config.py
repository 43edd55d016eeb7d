"""Device configuration on the controller: the desired version per device, signed and kept retained on the broker.

An operator sets a device's configuration through the API or ``edgectl device config set``; the store
gives it the next version (``device_configs``, migration 13). The engine leader signs each version not
yet published and publishes it retained on ``edge/v1/devices/<id>/config`` (:class:`ConfigSender`),
again after every reconnect with a fresh expiry (the agent ignores a version it handled). The agent
reports what became of it in its state (``config``); :func:`config_sync` compares the two.
"""

from __future__ import annotations

import enum
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgecore.protocol.device_config import CONFIG_TYPE, ConfigSettings, ConfigState, ConfigStatus, DeviceConfig
from edgecore.protocol.envelope import sign
from edgectl.controller.sets import DESIRED_VALIDITY_S

__all__ = ["ConfigSender", "ConfigStore", "ConfigSync", "DesiredConfig", "config_sync", "config_view", "sign_config"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DesiredConfig:
    """The configuration the operators want a device to run: its version and settings, and the version published."""

    device_id: str
    version: int
    settings: ConfigSettings
    updated_by: str = ""
    updated_at: float = 0.0
    published: int = 0  # the version the leader last published (0: none yet)

    def to_dict(self) -> dict[str, Any]:
        return {"device_id": self.device_id, "version": self.version, "settings": self.settings.to_json(),
                "updated_by": self.updated_by, "updated_at": self.updated_at, "published": self.published == self.version}

    @classmethod
    def from_columns(cls, r: Any) -> DesiredConfig:
        return cls(str(r["device_id"]), int(r["version"]), ConfigSettings.from_json(json.loads(r["settings"])),
                   str(r["updated_by"] or ""), float(r["updated_at"] or 0.0), int(r["published"] or 0))


class ConfigStore(Protocol):
    """``device_configs`` rows (edgectl/controller/store/device_configs.py)."""

    def put_device_config(self, device_id: str, settings: ConfigSettings, actor: str, at: float) -> DesiredConfig:
        """Store ``settings`` as the device's next version (1 for its first) and return it."""
    def device_config(self, device_id: str) -> DesiredConfig | None: ...
    def device_configs(self, unpublished: bool = False) -> list[DesiredConfig]:
        """Every device's desired configuration (``unpublished``: those whose version the leader has not published)."""
    def mark_config_published(self, device_id: str, version: int) -> None: ...


class ConfigSync(str, enum.Enum):
    """How a device's reported configuration compares with the desired one."""

    NONE = "none"  # no configuration set by the operators: agent.yaml alone
    PENDING = "pending"  # not handled by the device yet (offline, or the report is on its way)
    IN_SYNC = "in sync"
    REFUSED = "refused"  # the device refused the desired version: its reason is in the report


def config_sync(desired: DesiredConfig | None, reported: ConfigStatus | None) -> ConfigSync:
    if desired is None:
        return ConfigSync.NONE
    if reported is None or reported.version < desired.version:
        return ConfigSync.PENDING
    if reported.applied_version == desired.version:
        return ConfigSync.IN_SYNC
    if reported.version == desired.version and reported.status is ConfigState.REFUSED:
        return ConfigSync.REFUSED
    return ConfigSync.PENDING


def config_view(desired: DesiredConfig | None, reported: ConfigStatus | None) -> dict[str, Any]:
    """What the API, the CLI and the console show: desired, reported and whether they agree."""
    return {"desired": None if desired is None else desired.to_dict(),
            "reported": None if reported is None else reported.to_json(), "sync": config_sync(desired, reported).value}


def sign_config(key: Ed25519PrivateKey, desired: DesiredConfig, now: float) -> bytes:
    payload = DeviceConfig(desired.device_id, desired.version, now, now + DESIRED_VALIDITY_S, desired.settings).to_payload()
    return sign(CONFIG_TYPE, payload, key).to_bytes()


class ConfigSender:
    """The leader's side: publish each unpublished version retained; after a reconnect, every version again."""

    def __init__(self) -> None:
        self.all_due = True  # a new leader, or a broker that may have lost its retained messages

    def republish(self) -> None:
        self.all_due = True

    def send(self, store: ConfigStore, key: Ed25519PrivateKey, publish: Callable[[str, bytes], bool], gone: set[str],
             now: float) -> int:
        """Publish what is due (``publish(device_id, payload)``, retained); return how many went."""
        sent, every = 0, self.all_due
        for desired in store.device_configs(unpublished=not every):
            if desired.device_id in gone:
                continue
            if not publish(desired.device_id, sign_config(key, desired, now)):
                log.warning("broker did not take configuration v%d for %s", desired.version, desired.device_id)
                return sent  # all_due stays: the next tick tries again
            store.mark_config_published(desired.device_id, desired.version)
            sent += 1
        self.all_due = self.all_due and not every
        return sent
