"""The agent's configuration (configs/agent.yaml), every key also ``EDGE_AGENT_<KEY>`` or ``--set``."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from agent.errors import ConfigError
from agent.protocol.topics import validate_id
from agent.settings import load_settings
from agent.transport import broker_urls, check_transport_security

__all__ = ["AgentConfig", "load_agent_config"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TlsSettings:
    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None


@dataclass(frozen=True)
class TrustSettings:
    packages: list[Path] = field(default_factory=list)  # PEM public keys that may sign packages
    controllers: list[Path] = field(default_factory=list)  # PEM public keys that may sign commands


@dataclass(frozen=True)
class InferenceSettings:
    host: str = "127.0.0.1"
    port: int = 8080
    max_request_bytes: int = 64 * 1024 * 1024
    # Bounds and access of the local API: see agent/serving/server.py and docs/runtime.md.
    max_inflight_bytes: int = 256 * 1024 * 1024
    max_response_bytes: int = 64 * 1024 * 1024
    workers: int = 4
    max_queue: int = 64
    max_connections: int = 2048
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    idle_timeout_s: float = 60.0
    memory_limit_mb: int | None = None  # soft RLIMIT_AS: None = mapped + physical memory, 0 = none
    token_file: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    client_ca: Path | None = None
    insecure: bool = False  # serve off loopback with neither token nor mutual TLS


@dataclass(frozen=True)
class DeploySettings:
    download_deadline_s: float = 3600.0
    request_interval_s: float = 3.0
    stage_timeout_s: float = 120.0
    stage_memory_mb: int = 4096
    health_runs: int = 20
    health_max_latency_ms: float | None = None
    selection_budget_s: float = 3.0
    max_restarts_per_state: int = 3
    download_quota_bytes: int | None = None  # cap on bytes a download may write (a small-disk seam)
    # Artifacts over HTTP(S) Range (the desired state's model.urls; agent/deploy/http_fetch.py):
    http_max_bytes_per_s: int | None = None  # cap on this device's HTTP download rate; None: no cap
    http_timeout_s: float = 15.0  # connect and read timeout of one HTTP request
    http_ca: Path | None = None  # CA bundle for https URLs; None: the system's trust store
    crash_loop_max_deaths: int = 3  # deaths of the agent while running one model before it is rolled back
    crash_loop_window_s: float = 3600.0  # ... counted within this window
    load_timeout_s: float = 600.0  # a load (backend measurement included) longer than this counts as a hang


@dataclass(frozen=True)
class AgentConfig:
    device_id: str
    # One broker URL, or the nodes of a cluster separated by commas; ``brokers`` is the same as a
    # YAML list and, when given, replaces ``broker``. The agent connects to the first that
    # answers and moves to the next when the connection is lost (agent.transport).
    broker: str = "mqtt://127.0.0.1:1883"
    brokers: list[str] = field(default_factory=list)
    mqtt_protocol: str = "auto"
    insecure: bool = False
    tls: TlsSettings = field(default_factory=TlsSettings)
    state_dir: Path = Path("/var/lib/edge-agent")
    target: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    trust: TrustSettings = field(default_factory=TrustSettings)
    inference: InferenceSettings = field(default_factory=InferenceSettings)
    deploy: DeploySettings = field(default_factory=DeploySettings)
    telemetry_interval_s: float = 10.0
    hardware_root: Path = Path("/")
    log_level: str = "INFO"
    log_json: bool = False

    def __post_init__(self) -> None:
        if self.brokers:  # one spelling for the transport: config.broker names every node
            object.__setattr__(self, "broker", ",".join(self.brokers))

    @property
    def broker_urls(self) -> list[str]:
        return broker_urls(self.broker)

    def check(self, where: str) -> AgentConfig:
        validate_id(self.device_id)
        check_transport_security(self.broker_urls, self.insecure, where)
        if any(url.startswith("mqtts") for url in self.broker_urls) and self.tls.cert is None:
            log.warning("TLS without a client certificate: the broker cannot authenticate this device")
        if not self.trust.packages:
            raise ConfigError(f"{where}: trust.packages is empty: name at least one public key that signs packages")
        for path in [*self.trust.packages, *self.trust.controllers]:
            if not path.is_file():
                raise ConfigError(f"{where}: trusted key {path} does not exist")
        return self


def load_agent_config(path: Path | None, overrides: Mapping[str, str] = {}) -> AgentConfig:
    """Load and validate the agent configuration."""
    config = load_settings(AgentConfig, path, "EDGE_AGENT_", overrides)
    return config.check(str(path) if path else "configuration")
