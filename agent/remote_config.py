"""The controller's configuration of this agent: verified, checked, applied over agent.yaml, kept across restarts.

agent.yaml stays the base; a configuration (edgecore/protocol/device_config.py) overrides only the keys
it may set. The newest version is saved in ``<state>/config.json`` (atomically, before it takes effect),
so a restart comes up with it. A version whose settings are invalid is refused with the reason and
consumes its version (its replay is refused as a replay); the configuration in force stays. A bad
signature, another device's or an expired configuration is rejected like any controller message and
changes nothing, so the controller's re-signed copy of the same version (fresh expiry) is still taken.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path

from agent.config import AgentConfig
from agent.serving import InferenceServer
from edgecore.durable import atomic_write_json, read_json
from edgecore.errors import OperationFailed, ProtocolError
from edgecore.protocol.device_config import CONFIG_TYPE, ConfigSettings, ConfigState, ConfigStatus, DeviceConfig
from edgecore.protocol.envelope import TrustedKeys
from edgecore.protocol.messages import verify_signed
from edgecore.protocol.schema import Fields, decode_json

__all__ = ["RemoteConfig", "overlay", "put_in_force"]

log = logging.getLogger(__name__)

SCHEMA = 1  # of config.json


def overlay(base: AgentConfig, settings: ConfigSettings) -> AgentConfig:
    """``base`` with the keys ``settings`` sets; tags are merged over agent.yaml's (a remote tag wins)."""
    config = base
    if settings.telemetry_interval_s is not None:
        config = dataclasses.replace(config, telemetry_interval_s=settings.telemetry_interval_s)
    if settings.log_level is not None:
        config = dataclasses.replace(config, log_level=settings.log_level)
    if settings.tags is not None:
        config = dataclasses.replace(config, tags={**base.tags, **settings.tags})
    if settings.maintenance_windows is not None:
        config = dataclasses.replace(config, maintenance_windows=list(settings.maintenance_windows))
    if settings.inference_max_queue is not None:
        config = dataclasses.replace(config, inference=dataclasses.replace(config.inference,
                                                                           max_queue=settings.inference_max_queue))
    return config


def put_in_force(config: AgentConfig, server: InferenceServer) -> None:
    """Make what a configuration changes take effect in the running agent (the rest is read where it is used)."""
    logging.getLogger().setLevel(config.log_level)
    # The pool reads its limits on every request: the queue bound applies to the next one, HTTP and gRPC alike.
    server.pool.limits = dataclasses.replace(server.pool.limits, max_queue=config.inference.max_queue)


class RemoteConfig:
    """The configuration in force (``applied``) and what became of the newest version handled (``status``)."""

    def __init__(self, state_dir: Path, device_id: str, keys: Callable[[], TrustedKeys]) -> None:
        self.path = state_dir / "config.json"
        self.device_id = device_id
        self.keys = keys
        self.applied: DeviceConfig | None = None
        self.status: ConfigStatus | None = None
        self._load()

    def effective(self, base: AgentConfig) -> AgentConfig:
        return base if self.applied is None else overlay(base, self.applied.settings)

    def take(self, raw: bytes, retained: bool) -> ConfigStatus | None:
        """Handle a signed configuration; its status, or None when it is one already handled.

        Raises EdgeError for what is rejected without a status (signature, address, expiry, a replay)."""
        f = decode_json(verify_signed(raw, self.keys(), CONFIG_TYPE), "config")
        version, last = f.integer("version", 1), self.status.version if self.status else 0
        if version <= last:
            if retained or version == last:  # the broker's copy on reconnect, or the controller's re-signed copy
                return None
            raise ProtocolError(f"stale or replayed configuration: version {version} <= last handled {last}")
        DeviceConfig(f.text("device_id", 64), version, 0.0, f.number("expires_at")).check_for(self.device_id)
        try:
            config = DeviceConfig.read(f)
        except ProtocolError as exc:  # invalid settings: refused, and the version is used up
            return self._save(self.applied, ConfigStatus(version, ConfigState.REFUSED, str(exc), self._in_force()))
        return self._save(config, ConfigStatus(version, ConfigState.APPLIED, "", version))

    def _in_force(self) -> int:
        return self.applied.version if self.applied else 0

    def _save(self, applied: DeviceConfig | None, status: ConfigStatus) -> ConfigStatus:
        """Write first, then take the new values: memory never runs ahead of the disk."""
        try:
            atomic_write_json(self.path, {"schema": SCHEMA, "applied": applied.to_json() if applied else None,
                                          "status": status.to_json()})
        except OSError as exc:
            raise OperationFailed(f"cannot save the configuration: {exc.strerror or exc}") from exc
        self.applied, self.status = applied, status
        return status

    def _load(self) -> None:
        data = read_json(self.path)
        if data is None:
            return
        try:
            f = Fields(data, str(self.path))
            if f.integer("schema") != SCHEMA:
                raise ProtocolError(f"{self.path}: unsupported schema {f.data['schema']}")
            applied = f.opt_obj("applied")
            self.applied = None if applied is None else DeviceConfig.read(applied)
            status = f.opt_obj("status")
            self.status = None if status is None else ConfigStatus.read(status)
        except ProtocolError as exc:  # never half-trusted: agent.yaml alone until the controller's copy comes
            log.error("ignoring the saved configuration: %s", exc)
            self.applied, self.status = None, None
