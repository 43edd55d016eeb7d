"""What the controller, the fleet domain layer and the CLI need from persistent storage.

Two back-ends implement :class:`Store`: :class:`~edgectl.controller.store.sqlite.SqliteStore` (one
file, one controller) and :class:`~edgectl.controller.store.postgres.PostgresStore` (one database,
several controller replicas). Records cross this boundary as the typed dataclasses of
:mod:`edgectl.controller.records`, :mod:`edgectl.controller.queries` (the console's questions about many
devices at once), :mod:`edgectl.controller.accounts` (users and tokens) and
:mod:`edgectl.controller.history` (telemetry history).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from edgecore.errors import EdgeError
from edgectl.controller.accounts import TokenRow, UserRow
from edgectl.controller.device_config import ConfigStore
from edgectl.controller.groups import DeviceGroup
from edgectl.controller.history import TelemetryPoint
from edgectl.controller.logs import LogStore
from edgectl.controller.queries import AuditPage, AuditQuery, DevicePage, DeviceQuery, UploadedPackage
from edgectl.controller.records import (
    AuditEntry,
    DeviceEventRow,
    DeviceRecord,
    LatencyPoint,
    RolloutDevice,
    RolloutRow,
    RolloutStatus,
)
from edgectl.controller.webhooks import Attempt, Delivery, DeliveryStatus, Webhook

__all__ = ["ENGINE_LEASE", "GUARDED", "ConsoleStore", "Fenced", "Lease", "LeaseToken", "Retention", "Store", "StoreUnavailable",
           "WebhookStore"]

DAY_S = 86400.0
ENGINE_LEASE = "engine"  # the lease of the engine leader (PostgreSQL: its row of the ``leases`` table)

# Device fields written only when the time the controller received them (the key, on the store's
# clock) is not older than the one kept: reports ingested out of order (two controller replicas, a
# redelivery) never overwrite newer ones. A device's own claimed time orders nothing here (ingest drops a retained copy
# older than a report it stored moments ago: edgectl/controller/ingest.py, Ingest.stale).
GUARDED: dict[str, tuple[str, ...]] = {
    "presence_at": ("online",),
    "birth_at": ("birth",),
    "state_at": ("state",),
    "telemetry_at": ("telemetry", "telemetry_ts"),
}
DEVICE_FIELDS = ("online", "last_seen", "birth", "state", "telemetry", "telemetry_ts", *GUARDED)


class StoreUnavailable(EdgeError):
    """The store cannot be read or written now: down, restarting, read-only, out of disk, or every connection busy.

    Raised in place of the database driver's errors (the boundary is the back-end's ``_execute``).
    The controller waits with backoff and resumes; the API answers 503; the CLI exits 4, as for an
    unreachable broker."""

    exit_code = 4


class Fenced(EdgeError):
    """A write of an engine leader whose lease lapsed or passed to another controller: refused by the store."""


@dataclass(frozen=True)
class LeaseToken:
    """What a held engine lease grants: the holder's name and the fencing number (``epoch``) every leader write carries."""

    holder: str
    epoch: int


@dataclass(frozen=True)
class Retention:
    """How much telemetry history the store keeps per device; 0 means no limit of that kind.

    Pruning runs at most every ``every_s`` seconds, over the devices written since the last run
    (``Store.prune`` runs it at once). The audit log and rollout rows are never pruned."""

    latency_rows: int = 1000  # newest p95 figures per device
    events: int = 500  # newest deployment events per device (events not yet applied are kept)
    max_age_s: float = 30 * DAY_S  # older latency rows, events and telemetry history go, whatever their count
    every_s: float = 60.0
    telemetry_rows: int = 1000  # newest telemetry history points per device (the console's device charts)


class Lease(Protocol):
    """The right to drive rollouts: exactly one controller holds it at a time."""

    @property
    def replicated(self) -> bool:
        """Whether several controllers may run on this store (so ingest is shared between them)."""

    def check(self) -> bool:
        """Take or keep the lease now; False while another controller holds it or the store is unreachable."""

    def token(self) -> LeaseToken | None:
        """The lease's token while it is held for certain (by this process's monotonic clock), else None."""

    def release(self) -> None: ...


class ConsoleStore(Protocol):
    """What the REST API, /metrics and ``edgectl users|tokens`` ask the store: device pages and counts
    (filtered, counted and paged in SQL), users, tokens (hashes only), uploaded packages and device groups."""

    def device_page(self, query: DeviceQuery) -> DevicePage:
        """Devices matching ``query``, ordered by id, one page of them and the total count."""
    def device_tag_keys(self) -> set[str]:
        """Every tag key some device reports in its birth."""
    def device_counts(self) -> dict[tuple[str, str], int]:
        """Devices by (target, status online|offline|unknown)."""
    def device_models(self) -> dict[tuple[str, int | None], int]:
        """Devices by (model name, version) they serve, a device under each of its models; ("", None): serving nothing."""
    def ingest_lags(self, since: float) -> list[float]:
        """Seconds from each device's last telemetry report (its ``ts``) to the store, for reports since ``since``."""
    def add_user(self, user: UserRow) -> bool:
        """Add ``user``; False when the name is taken."""
    def users(self) -> list[UserRow]: ...
    def user(self, name: str) -> UserRow | None: ...
    def remove_user(self, name: str, revoked: float) -> bool:
        """Remove the user and revoke its tokens; False when there is no such user."""
    def add_token(self, token: TokenRow) -> None: ...
    def tokens(self, user: str | None = None) -> list[TokenRow]: ...
    def token(self, token_id: str) -> TokenRow | None: ...
    def revoke_token(self, token_id: str, revoked: float) -> bool:
        """Revoke one token; False when there is no such token or it was revoked already."""
    def save_package(self, package: UploadedPackage) -> None:
        """List an uploaded package (again: its newer upload replaces the entry)."""
    def packages(self) -> list[UploadedPackage]:
        """Uploaded packages, oldest upload first."""
    def audit_page(self, query: AuditQuery) -> AuditPage:
        """Audit entries matching ``query``: a page of the newest, oldest first within it, and the total."""
    def add_group(self, group: DeviceGroup) -> bool:
        """Keep a new device group; False when the name is taken."""
    def save_group(self, group: DeviceGroup) -> bool:
        """Replace the group of that name; False when there is none."""
    def group(self, name: str) -> DeviceGroup | None: ...
    def groups(self) -> list[DeviceGroup]:
        """Every device group, by name."""
    def remove_group(self, name: str) -> bool:
        """Delete a group; False when there is none."""


class WebhookStore(Protocol):
    """Webhook subscriptions and their deliveries (``store/webhooks.py``); ``audit`` makes the deliveries of an event."""

    def add_webhook(self, hook: Webhook) -> None: ...
    def webhooks(self) -> list[Webhook]: ...
    def webhook(self, webhook_id: str) -> Webhook | None: ...
    def remove_webhook(self, webhook_id: str) -> bool:
        """Remove the subscription and its deliveries; False when there is none."""
    def deliveries(self, webhook_id: str | None = None, status: DeliveryStatus | None = None,
                   limit: int = 100) -> list[Delivery]:
        """Deliveries, newest first."""
    def delivery(self, delivery_id: str) -> Delivery | None: ...
    def claim_deliveries(self, worker: str, now: float, hold_s: float, limit: int = 20) -> list[tuple[Delivery, Webhook]]:
        """Due pending deliveries of enabled webhooks, each claimed for ``worker`` until ``now + hold_s`` (once, of all
        replicas claiming at the same time)."""
    def record_attempt(self, delivery_id: str, worker: str, attempt: Attempt) -> bool:
        """Count one attempt and release the claim; False when ``worker`` no longer holds it."""
    def prune_deliveries(self, before: float) -> int:
        """Delete delivered and failed deliveries made before ``before`` (pending ones stay); return how many went."""
    def redeliver(self, delivery_id: str, now: float) -> Delivery | None:
        """A new pending delivery of the same event and body, due now; None when there is no such delivery."""


class Store(ConsoleStore, WebhookStore, LogStore, ConfigStore, Protocol):
    """The whole interface to the controller's persistent state."""

    retention: Retention

    def location(self) -> str:
        """Where the store lives, for logs and the audit log (a path or a URL without credentials)."""
    def batch(self) -> AbstractContextManager[None]:
        """``with store.batch():`` groups writes in one transaction (nested batches join the outer one)."""
    def keep_package(self, variant: str, source: Path) -> Path:
        """Keep a rollout's package where every controller replica can read it; return where it lies here."""
    def package_file(self, variant: str, recorded: Path) -> Path:
        """A readable local file of a kept package (``recorded``: the path the rollout spec names)."""
    def lease(self) -> Lease:
        """A new engine lease on this store (one per controller process)."""
    def fenced(self, token: Callable[[], LeaseToken | None]) -> Store:
        """This store (the same connections) whose engine writes (rollouts, rows, claims, requests, audit, latency)
        apply only while ``token()`` names the lease the store holds as current: others raise :class:`Fenced`."""
    def now(self) -> float:
        """The store's clock (seconds since the epoch): one clock for every replica's timers and receive times."""
    def ping(self) -> None:
        """Raise :class:`StoreUnavailable` unless the store answers and takes writes now."""
    def connections(self) -> int:
        """Connections this process has open to the store now (on PostgreSQL at most the pool's size)."""
    def close(self) -> None: ...
    def release(self) -> None:
        """This thread is done with the store for now (an API request thread ends): its connections go to an
        idle pool that the next thread takes from, so short-lived threads do not each keep one open."""
    # -- devices ------------------------------------------------------------------------------
    def upsert_device(self, device_id: str, **fields: Any) -> None:
        """Set device fields (``birth``, ``state``, ``telemetry``: the device's typed reports); a ``*_at`` key of
        :data:`GUARDED` makes its fields apply only if not older."""
    def devices(self) -> list[DeviceRecord]: ...
    def device(self, device_id: str) -> DeviceRecord | None: ...
    def telemetry_summary(self) -> tuple[int, float | None]:
        """(devices online, when the newest telemetry report was stored): is any replica receiving telemetry."""
    def add_latency(self, device_id: str, model: str, version: int, p95_ms: float, source: str, ts: float,
                    claimed: float | None = None) -> bool:
        """Keep a p95 figure; ``claimed``: the device's own time of the telemetry report it came from, which keeps
        it once per report and model (False: kept already, by another replica). None: kept every time."""
    def latency(self, device_id: str, model: str | None = None, version: int | None = None,
                since: float = 0.0, limit: int = 500) -> list[LatencyPoint]: ...
    def add_telemetry(self, point: TelemetryPoint, claimed: float | None = None) -> bool:
        """Keep one point of a device's telemetry history (within :class:`Retention`); True when added. ``claimed``:
        the device's own time of the report, which keeps a point once per report (device, claimed time, model):
        False when another replica kept it already. A report that claims no time is kept every time."""
    def telemetry_history(self, device_id: str, since: float = 0.0, limit: int = 500) -> list[TelemetryPoint]:
        """The newest ``limit`` points since ``since``, oldest first."""
    def add_event(self, device_id: str, ts: float, deployment_id: str, state: str, status: str, detail: str,
                  data: dict[str, Any]) -> None:
        """Keep a device event once (a copy with the same device, time, deployment, state and status is ignored)."""
    def claim_event(self, event: DeviceEventRow) -> bool:
        """Mark a kept event applied to the rollouts; False if it was already (by this or another controller)."""
    def unclaimed_events(self, limit: int = 1000) -> list[DeviceEventRow]:
        """Kept events no engine leader applied yet, oldest first (stored by a standby replica)."""
    def events(self, device_id: str, limit: int = 20) -> list[DeviceEventRow]: ...
    def prune(self, now: float | None = None) -> int:
        """Apply the retention to every device now; return how many rows went."""
    # -- rollouts -----------------------------------------------------------------------------
    def create_rollout(self, rollout: RolloutRow, devices: Iterable[RolloutDevice]) -> None: ...
    def save_rollout(self, rollout: RolloutRow) -> None: ...
    def rollout(self, rollout_id: str) -> RolloutRow | None: ...
    def rollouts(self, statuses: Iterable[RolloutStatus] | None = None) -> list[RolloutRow]: ...
    def rollout_devices(self, rollout_id: str) -> list[RolloutDevice]: ...
    def device_rollouts(self, device_id: str) -> list[RolloutDevice]: ...
    def save_rollout_device(self, row: RolloutDevice) -> None: ...
    # -- audit and requests -------------------------------------------------------------------
    def audit(self, action: str, detail: str = "", rollout_id: str = "", device_id: str = "",
              actor: str = "controller") -> None: ...
    def audit_log(self, rollout_id: str | None = None, device_id: str | None = None, limit: int = 1000) -> list[AuditEntry]: ...
    # -- records taken out (store/retired.py) -------------------------------------------------------
    def decommission_device(self, device_id: str, at: float) -> bool:
        """Take the device out of the fleet (kept for history); False when there is none or it is out already."""
    def decommissioned_ids(self) -> set[str]: ...
    def unwithdrawn(self) -> list[str]:
        """Decommissioned devices whose retained desired state the controller has not cleared on the broker yet."""
    def mark_withdrawn(self, device_id: str, at: float) -> None: ...
    def delete_device(self, device_id: str) -> bool:
        """Remove a decommissioned device's row, served models and history; False unless it is decommissioned."""
    def discard_package(self, variant: str) -> bool:
        """Unlist an uploaded package and remove its kept file; False when it was not listed."""
    def request(self, rollout_id: str, action: str) -> None: ...
    def take_requests(self) -> list[tuple[str, str]]: ...
