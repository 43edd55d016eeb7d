"""The agent's configuration (configs/agent.yaml), every key also ``EDGE_AGENT_<KEY>`` or ``--set``."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from edgecore.errors import ConfigError
from edgecore.protocol.topics import validate_id
from edgecore.settings import load_settings
from edgecore.tls import TlsSettings
from edgecore.transport import broker_urls, check_transport_security
from edgecore.windows import WindowError, Windows, zone

__all__ = ["AgentConfig", "load_agent_config"]

log = logging.getLogger(__name__)


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
    grpc_port: int | None = None  # the gRPC API on inference.host (the agent's grpc extra); None: off


@dataclass(frozen=True)
class DeploySettings:
    download_deadline_s: float = 3600.0
    request_interval_s: float = 3.0
    stage_timeout_s: float = 120.0
    stage_memory_mb: int = 4096
    health_runs: int = 20
    health_max_latency_ms: float | None = None
    selection_budget_s: float = 10.0  # the backend contest's budget while it cannot tell them apart (clear: 5 rounds)
    max_restarts_per_state: int = 3
    download_quota_bytes: int | None = None  # cap on bytes a download may write (a small-disk seam)
    # Artifacts over HTTP(S) Range (the desired state's model.urls; edgecore/delivery/http_fetch.py):
    http_max_bytes_per_s: int | None = None  # cap on this device's HTTP download rate; None: no cap
    http_timeout_s: float = 15.0  # connect, one read, a response head; each chunk's grace beyond the rate below
    http_ca: Path | None = None  # CA bundle for https URLs; None: the system's trust store
    http_min_bytes_per_s: int = 4096  # a chunk slower than this (after http_timeout_s) stalls its URL: the next is tried
    # Redirects go to the signed URLs' origins only, and to these hosts ("cdn.example.org", "*.amazonaws.com") ...
    http_redirect_hosts: list[str] = field(default_factory=list)
    http_redirect_private: bool = False  # ... which may resolve to loopback/private addresses only when this is true
    crash_loop_max_deaths: int = 3  # deaths of the agent while running one model before it is rolled back
    crash_loop_window_s: float = 3600.0  # ... counted within this window
    load_timeout_s: float = 600.0  # a load (backend measurement included) longer than this counts as a hang


@dataclass(frozen=True)
class RemeasureSettings:
    """Re-measuring the serving model's backends when the device is idle (agent/idle_remeasure.py, docs/runtime.md)."""

    every_s: float = 21600.0  # a pick older than this is measured again at the next idle moment; 0 turns it off
    idle_s: float = 120.0  # idle: no inference request and no job for this long (a pick made by the estimate: due then)
    max_load: float = 0.5  # ... and a 1-minute load average per core at most this
    budget_s: float = 10.0  # the contest's time budget while it cannot tell the backends apart
    min_agreement: float = 1.0  # share of shadow samples the faster backend must answer as the serving one does


@dataclass(frozen=True)
class ModelsSettings:
    """The set of models and pipelines the device runs (docs/runtime.md, Many models)."""

    memory_budget_mb: float | None = None  # what the set's footprints may add up to; None: min(RAM, cgroup limit)
    remove_drain_s: float = 30.0  # a removed model's requests in flight get this long before its files are deleted


@dataclass(frozen=True)
class AgentConfig:
    device_id: str
    # One broker URL, or the nodes of a cluster separated by commas; ``brokers`` is the same as a
    # YAML list and, when given, replaces ``broker``. The agent connects to the first that
    # answers and moves to the next when the connection is lost (edgecore.transport).
    broker: str = "mqtt://127.0.0.1:1883"
    brokers: list[str] = field(default_factory=list)
    # A broker that brings neither the controller's signed beacon nor a desired state signed for this
    # device within this many seconds of a connect is not the fleet's: the agent moves on to the next
    # URL (agent/fleet_check.py; with one URL it only warns). 0 turns the check off.
    broker_check_s: float = 120.0
    mqtt_protocol: str = "auto"
    insecure: bool = False
    tls: TlsSettings = field(default_factory=TlsSettings)
    state_dir: Path = Path("/var/lib/edge-agent")
    target: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    # The IANA time zone (Europe/Berlin) maintenance windows are read in; unset: $TZ, /etc/timezone or what
    # /etc/localtime links to (edgecore.windows.device_timezone). Reported in the birth.
    timezone: str | None = None
    # Windows (DAYS HH:MM-HH:MM, device time) outside which this device installs no update, whatever its groups say;
    # the controller's configuration may set them (edgectl device config set ... maintenance_windows=...).
    maintenance_windows: list[str] = field(default_factory=list)
    trust: TrustSettings = field(default_factory=TrustSettings)
    inference: InferenceSettings = field(default_factory=InferenceSettings)
    deploy: DeploySettings = field(default_factory=DeploySettings)
    remeasure: RemeasureSettings = field(default_factory=RemeasureSettings)
    models: ModelsSettings = field(default_factory=ModelsSettings)
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
        if not self.broker_check_s >= 0:  # NaN too
            raise ConfigError(f"{where}: broker_check_s must be 0 (off) or a number of seconds, not {self.broker_check_s}")
        check_transport_security(self.broker_urls, self.insecure, where)
        try:
            if self.timezone is not None:
                zone(self.timezone)
            Windows.parse(self.maintenance_windows, "maintenance_windows")
        except WindowError as exc:
            raise ConfigError(f"{where}: {'timezone: ' if 'time zone' in str(exc) else ''}{exc}") from None
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
