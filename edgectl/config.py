"""edgectl's configuration: ``edgectl.yaml`` (or --config), every key also ``EDGECTL_<KEY>``."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from agent.config import TlsSettings
from agent.settings import load_settings
from edgectl.home import edgectl_home

__all__ = ["ControllerSettings", "EdgectlConfig", "load_edgectl_config"]

SEARCH = (Path("edgectl.yaml"), Path.home() / ".config" / "edgectl" / "edgectl.yaml")


@dataclass(frozen=True)
class DeployDefaults:
    timeout_s: float = 600.0
    valid_days: float = 90.0
    chunk_size: int = 64 * 1024


@dataclass(frozen=True)
class ControllerSettings:
    # The rollout store (SQLite file); None: $EDGECTL_HOME/controller.db. Relative paths are
    # relative to the config file. `edgectl deploy --fleet`, `rollout ...` and `controller run`
    # must all use the same one.
    store: Path | None = None

    def store_path(self) -> Path:
        return self.store or edgectl_home() / "controller.db"


@dataclass(frozen=True)
class EdgectlConfig:
    # One broker URL, or the nodes of a cluster separated by commas; ``brokers`` is the same as a
    # YAML list and, when given, replaces ``broker``. Used by every command and the controller.
    broker: str | None = None
    brokers: list[str] = field(default_factory=list)
    insecure: bool = False
    mqtt_protocol: str = "auto"
    tls: TlsSettings = field(default_factory=TlsSettings)
    deploy: DeployDefaults = field(default_factory=DeployDefaults)
    controller: ControllerSettings = field(default_factory=ControllerSettings)


def load_edgectl_config(path: Path | None) -> EdgectlConfig:
    """The given file, else the first of ./edgectl.yaml and ~/.config/edgectl/edgectl.yaml, else defaults."""
    if path is None:
        path = next((p for p in SEARCH if p.is_file()), None)
    if path is not None:  # relative paths inside are relative to the file: make them absolute
        path = path.absolute()
    # These three select the file, broker and home directory; they are not config keys.
    environ = {k: v for k, v in os.environ.items() if k not in ("EDGECTL_CONFIG", "EDGECTL_BROKER", "EDGECTL_HOME")}
    return load_settings(EdgectlConfig, path, "EDGECTL_", environ=environ)
