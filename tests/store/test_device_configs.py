"""Desired device configurations in the store (migration 13) on SQLite and PostgreSQL, and the leader's publishing."""

from __future__ import annotations

import json

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgecore.protocol.device_config import CONFIG_TYPE, ConfigSettings, ConfigState, ConfigStatus, DeviceConfig
from edgecore.protocol.envelope import Envelope, TrustedKeys
from edgectl.controller.device_config import ConfigSender, ConfigSync, config_sync
from edgectl.controller.store import Store


def test_versions_count_up_per_device_and_each_is_published_once_then_all_after_a_reconnect(store: Store) -> None:
    first = store.put_device_config("cam-1", ConfigSettings(log_level="DEBUG"), "api:ana", 10.0)
    second = store.put_device_config("cam-1", ConfigSettings(telemetry_interval_s=5.0), "cli:bo", 11.0)
    other = store.put_device_config("cam-2", ConfigSettings(), "api:ana", 12.0)
    assert (first.version, second.version, other.version) == (1, 2, 1)
    kept = store.device_config("cam-1")
    assert kept is not None and (kept.settings, kept.updated_by, kept.published) == (ConfigSettings(telemetry_interval_s=5.0),
                                                                                      "cli:bo", 0)
    key = Ed25519PrivateKey.generate()
    sent: list[tuple[str, bytes]] = []
    sender = ConfigSender()

    def publish(device_id: str, payload: bytes) -> bool:
        sent.append((device_id, payload))
        return True

    assert sender.send(store, key, publish, {"cam-2"}, 100.0) == 1  # a decommissioned device gets nothing
    config = DeviceConfig.from_payload(TrustedKeys([key.public_key()]).verify(Envelope.from_bytes(sent[0][1]), CONFIG_TYPE))
    assert (config.device_id, config.version, config.settings.telemetry_interval_s) == ("cam-1", 2, 5.0)
    assert sender.send(store, key, publish, set(), 101.0) == 1 and sent[-1][0] == "cam-2"  # cam-2 unpublished still
    assert sender.send(store, key, publish, set(), 102.0) == 0  # each version once
    sender.republish()
    assert sender.send(store, key, publish, set(), 103.0) == 2  # after a reconnect, every device's again
    assert json.loads(Envelope.from_bytes(sent[-1][1]).payload)["issued_at"] == 103.0  # re-signed, fresh expiry
    store.put_device_config("cam-1", ConfigSettings(), "api:ana", 13.0)
    assert sender.send(store, key, lambda *_: False, set(), 104.0) == 0  # the broker did not take it: still due
    assert sender.send(store, key, publish, set(), 105.0) == 1 and sent[-1][0] == "cam-1"


def test_sync_compares_desired_with_reported(store: Store) -> None:
    store.put_device_config("cam-1", ConfigSettings(), "api:ana", 10.0)
    desired = store.put_device_config("cam-1", ConfigSettings(log_level="INFO"), "api:ana", 11.0)
    assert config_sync(None, None) is ConfigSync.NONE
    assert config_sync(desired, None) is ConfigSync.PENDING
    assert config_sync(desired, ConfigStatus(1, ConfigState.APPLIED, "", 1)) is ConfigSync.PENDING
    assert config_sync(desired, ConfigStatus(2, ConfigState.APPLIED, "", 2)) is ConfigSync.IN_SYNC
    assert config_sync(desired, ConfigStatus(2, ConfigState.REFUSED, "settings.x: no", 1)) is ConfigSync.REFUSED
