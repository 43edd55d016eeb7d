"""What every endpoint reaches: the store, the accounts, the trusted package keys and the limits."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client import Counter as PromCounter

from edgecore.protocol.envelope import TrustedKeys
from edgectl.api.accounts import Accounts
from edgectl.api.oidc import Sso
from edgectl.controller.store import Store

__all__ = ["ApiContext", "ApiMetrics", "StoreTimer"]

STORE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class StoreTimer:
    """``edgectl_store_query_seconds``: how long the store answers the queries the API and metrics make."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.histogram = Histogram("edgectl_store_query_seconds", "Time the controller store took to answer a query.",
                                   ["query"], registry=registry, buckets=STORE_BUCKETS)

    @contextmanager
    def time(self, query: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.histogram.labels(query).observe(time.perf_counter() - start)


class ApiMetrics:
    """Request counters and timings of the API itself."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = PromCounter("edgectl_api_requests", "API requests answered.", ["method", "route", "status"],
                                    registry=registry)
        self.seconds = Histogram("edgectl_api_request_seconds", "Time to answer an API request.", ["route"],
                                 registry=registry)

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        self.requests.labels(method, route, str(status)).inc()
        self.seconds.labels(route).observe(seconds)


@dataclass
class ApiContext:
    store: Store
    accounts: Accounts
    trusted: Callable[[], TrustedKeys]  # package-signing public keys, read on each upload (keys rotate)
    registry: CollectorRegistry
    wave_timeout_s: float = 600.0
    max_upload_bytes: int = 1 << 30
    metrics_open: bool = False
    controller: Any = None  # the Controller service when the API runs inside `controller run`
    private_paths: tuple[str, ...] = ()  # directories of this host that no answer names (edgectl.api.server)
    approval_min_devices: int = 0  # controller.approval.min_devices: the two-person rule's size (edgectl.fleet.approvals)
    sso: Sso | None = None  # api.oidc: the provider's JWTs taken beside edgectl tokens (edgectl.api.oidc)
    timer: StoreTimer = field(init=False)
    requests: ApiMetrics = field(init=False)

    def __post_init__(self) -> None:
        self.timer = StoreTimer(self.registry)
        self.requests = ApiMetrics(self.registry)
