"""edgectl's configuration: ``edgectl.yaml`` (or --config), every key also ``EDGECTL_<KEY>``."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

from edgecore.settings import load_settings
from edgecore.tls import TlsSettings
from edgectl.controller.webhooks import RetryPolicy
from edgectl.home import edgectl_home

__all__ = ["ApiSettings", "ApprovalSettings", "ControllerSettings", "EdgectlConfig", "OidcSettings", "RetentionSettings",
           "load_edgectl_config"]

SEARCH = (Path("edgectl.yaml"), Path.home() / ".config" / "edgectl" / "edgectl.yaml")


@dataclass(frozen=True)
class DeployDefaults:
    timeout_s: float = 600.0
    valid_days: float = 90.0
    chunk_size: int = 64 * 1024


@dataclass(frozen=True)
class RetentionSettings:
    # Telemetry history the store keeps per device (0: no limit of that kind); docs/fleet.md.
    latency_rows: int = 1000
    events: int = 500
    max_age_days: float = 30.0
    telemetry_rows: int = 1000  # telemetry history points (the console's device charts)


@dataclass(frozen=True)
class ApprovalSettings:
    # The two-person rule (docs/fleet.md "Approvals"): a rollout to more devices than this waits for a second
    # operator's approval; 0: no size needs it (a protected group still does).
    min_devices: int = 0


@dataclass(frozen=True)
class ControllerSettings:
    # The rollout store: a SQLite file (a path, sqlite:///relative or sqlite:////absolute) for one
    # controller, or postgresql://... for replicas; None: $EDGECTL_HOME/controller.db. Relative
    # paths are relative to the config file. `edgectl deploy --fleet`, `rollout ...` and
    # `controller run` must all use the same one.
    store: str | None = None
    # The MQTT 5 shared-subscription group in which replicas on a postgresql:// store share
    # telemetry ($share/<group>/...); empty: every replica receives every report.
    share_group: str = "edgectl"
    retention: RetentionSettings = field(default_factory=RetentionSettings)
    # Webhook deliveries: attempts, backoff, timeout (docs/integrations.md).
    webhooks: RetryPolicy = field(default_factory=RetryPolicy)
    approval: ApprovalSettings = field(default_factory=ApprovalSettings)

    def store_url(self) -> str:
        return self.store or str(edgectl_home() / "controller.db")

    def store_path(self) -> Path | None:
        """The SQLite file of the store; None for a postgresql:// store."""
        url = self.store_url()
        if url.startswith("sqlite:///"):
            return Path(url[len("sqlite:///"):])
        return None if "://" in url else Path(url)


@dataclass(frozen=True)
class OidcSettings:
    # Single sign-on with OpenID Connect (docs/sso.md): the API takes the provider's JWTs beside edgectl tokens and
    # the console offers "Sign in with SSO". Off while issuer is empty. issuer: exactly the tokens' iss (its
    # /.well-known/openid-configuration is read); client_id: the console's client at the provider (a token whose aud
    # names it or audience is taken); client_secret: only for a confidential client (sent by the controller when it
    # redeems the console's code); roles_claim: where the roles are, a dotted path such as realm_access.roles;
    # role_map: claim value -> viewer/operator/admin (the highest one matched wins); leeway_s: allowed clock skew;
    # ca_file: the CA certificates that the provider's https:// certificate chains to, when not the system's.
    issuer: str = ""
    client_id: str = ""
    client_secret: str = ""
    audience: str = ""
    roles_claim: str = "roles"
    role_map: dict[str, str] = field(default_factory=dict)
    leeway_s: float = 60.0
    scopes: str = "openid profile email"
    ca_file: Path | None = None


@dataclass(frozen=True)
class ApiSettings:
    # The REST API and /metrics (`edgectl controller run --http ADDR`, `edgectl api serve`): HOST:PORT.
    # Off loopback it needs tls_cert and tls_key, unless insecure: true. See docs/api.md.
    listen: str = "127.0.0.1:8470"
    tls_cert: Path | None = None
    tls_key: Path | None = None
    insecure: bool = False
    metrics_open: bool = False  # /metrics without a token (a Prometheus that cannot send one)
    max_upload_mb: int = 1024
    # Bounds of the server (edgectl/httpd, docs/security.md "Servers"): threads that run requests (the most store
    # sessions the API holds), open connections in all and per client address, time to send a head, idle keep-alive.
    workers: int = 8
    max_connections: int = 512
    max_connections_per_address: int = 64
    header_timeout_s: float = 10.0
    idle_timeout_s: float = 30.0
    oidc: OidcSettings = field(default_factory=OidcSettings)


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
    api: ApiSettings = field(default_factory=ApiSettings)


# edgectl's environment variables that are not configuration keys: they select the config file, the broker, the home
# directory, the PKI directory and extra target-profile directories. Read as keys they failed every command (exit 2).
_NOT_SETTINGS = frozenset({"EDGECTL_CONFIG", "EDGECTL_BROKER", "EDGECTL_HOME", "EDGECTL_PKI", "EDGECTL_TARGETS_PATH"})


def load_edgectl_config(path: Path | None) -> EdgectlConfig:
    """The given file, else the first of ./edgectl.yaml and ~/.config/edgectl/edgectl.yaml, else defaults."""
    if path is None:
        path = next((p for p in SEARCH if p.is_file()), None)
    if path is not None:  # relative paths inside are relative to the file: make them absolute
        path = path.absolute()
    environ = {k: v for k, v in os.environ.items() if k not in _NOT_SETTINGS}
    config = load_settings(EdgectlConfig, path, "EDGECTL_", environ=environ)
    return _absolute_store(config, path.parent if path is not None else Path.cwd())


def _absolute_store(config: EdgectlConfig, base: Path) -> EdgectlConfig:
    """A relative SQLite store path (plain or ``sqlite:///``) made relative to the config file."""
    store = config.controller.store
    if not store or ("://" in store and not store.startswith("sqlite:///")):
        return config
    prefix = "sqlite:///" if store.startswith("sqlite:///") else ""
    path = Path(os.path.expanduser(store[len(prefix):]))
    if path.is_absolute():
        return config
    return dataclasses.replace(config, controller=dataclasses.replace(config.controller, store=prefix + str(base / path)))
