"""The API put together: its context, its full route table (with the OpenAPI document and /metrics), its server."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from edgectl.api.accounts import Accounts
from edgectl.api.admin import admin_routes
from edgectl.api.context import ApiContext
from edgectl.api.device_config import device_config_routes
from edgectl.api.device_logs import device_log_routes
from edgectl.api.devices import device_routes
from edgectl.api.groups import group_routes
from edgectl.api.metrics import FleetCollector, render
from edgectl.api.oidc import sso_from_settings
from edgectl.api.openapi import openapi_document
from edgectl.api.packages import package_routes
from edgectl.api.rollouts import rollout_routes
from edgectl.api.router import Request, Response, Route
from edgectl.api.server import ApiServer, parse_listen, server_tls
from edgectl.api.sso import sso_routes
from edgectl.api.webhooks import webhook_routes
from edgectl.config import ApiSettings, EdgectlConfig
from edgectl.controller.accounts import Role
from edgectl.controller.store import Store
from edgectl.fleet import package_keys
from edgectl.home import edgectl_home
from edgectl.httpd import ServerLimits
from edgectl.keys import Keyring

__all__ = ["api_context", "api_routes", "start_api"]

METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def api_routes(ctx: ApiContext) -> list[Route]:
    """Every route the server answers, the document and /metrics included."""
    routes = [*device_routes(ctx), *device_log_routes(ctx), *device_config_routes(ctx),
              *package_routes(ctx), *rollout_routes(ctx), *group_routes(ctx), *admin_routes(ctx),
              *webhook_routes(ctx), *sso_routes(ctx)]

    def document(_request: Request) -> Response:
        return Response(200, openapi_document(routes))

    def metrics(_request: Request) -> Response:
        return Response(200, render(ctx.registry), METRICS_TYPE)

    routes.append(Route("GET", "/api/v1/openapi.json", None, "This OpenAPI 3 document.", document, tag="meta"))
    routes.append(Route("GET", "/metrics", None if ctx.metrics_open else Role.VIEWER,
                        "Prometheus metrics (text format); a viewer token unless api.metrics_open.", metrics, tag="meta"))
    return routes


def api_context(store: Store, config: EdgectlConfig, controller: Any = None, keyring: Keyring | None = None) -> ApiContext:
    """The API's context on ``store``: package keys from the keyring (public halves only), metrics registered."""
    ring = keyring or Keyring()
    settings = config.api
    ctx = ApiContext(store, Accounts(store), lambda: package_keys(ring), CollectorRegistry(), config.deploy.timeout_s,
                     settings.max_upload_mb << 20, settings.metrics_open, controller, _private_paths(store),
                     approval_min_devices=config.controller.approval.min_devices, sso=sso_from_settings(settings.oidc))
    ctx.registry.register(FleetCollector(ctx))
    health = getattr(controller, "health", None)
    if health is not None:  # the controller's store, lease, broker and ingest buffer: there while the store is down
        from edgectl.controller.health import HealthCollector

        ctx.registry.register(HealthCollector(health))
    return ctx


def _private_paths(store: Store) -> tuple[str, ...]:
    """Where this host keeps uploads, packages and the store: named in no answer."""
    paths = {tempfile.gettempdir(), str(edgectl_home())}
    location = Path(store.location())
    if location.is_absolute():  # a SQLite file (a PostgreSQL store's location is its redacted URL)
        paths.add(str(location.parent))
    return tuple(sorted((p.rstrip("/") for p in paths if len(p.rstrip("/")) > 1), key=len, reverse=True))


def start_api(store: Store, config: EdgectlConfig, listen: str | None = None, controller: Any = None) -> ApiServer:
    """Serve the API (``listen`` overrides ``api.listen``) in a thread; ConfigError for an unsafe or bad setting."""
    settings: ApiSettings = config.api
    host, port = parse_listen(listen or settings.listen)
    ctx = api_context(store, config, controller)
    tls = server_tls(settings.tls_cert, settings.tls_key)
    limits = ServerLimits(header_timeout_s=settings.header_timeout_s, idle_timeout_s=settings.idle_timeout_s,
                          max_connections=settings.max_connections, max_per_address=settings.max_connections_per_address)
    return ApiServer(ctx, api_routes(ctx), host, port, tls, settings.insecure, limits, settings.workers).start()
