"""What the controller, the fleet domain layer and the CLI need from persistent storage.

Two back-ends implement :class:`Store`: :class:`~edgectl.controller.store.sqlite.SqliteStore` (one
file, one controller) and :class:`~edgectl.controller.store.postgres.PostgresStore` (one database,
several controller replicas). Records cross this boundary as the typed dataclasses of
:mod:`edgectl.controller.records`.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from edgectl.controller.records import (
    AuditEntry,
    DeviceEventRow,
    DeviceRow,
    LatencyPoint,
    RolloutDevice,
    RolloutRow,
    RolloutStatus,
)

__all__ = ["GUARDED", "Lease", "Retention", "Store"]

DAY_S = 86400.0

# Device fields written only when the device's own timestamp (the key) is not older than the one
# kept: reports ingested out of order (two controller replicas, a redelivery) never overwrite newer ones.
# Ingest does not order presence by its time: a last will carries the time its connection began.
GUARDED: dict[str, tuple[str, ...]] = {
    "presence_at": ("online",),
    "birth_at": ("birth",),
    "state_at": ("state",),
    "telemetry_at": ("telemetry", "telemetry_ts"),
}
DEVICE_FIELDS = ("online", "last_seen", "birth", "state", "telemetry", "telemetry_ts", *GUARDED)


@dataclass(frozen=True)
class Retention:
    """How much telemetry history the store keeps per device; 0 means no limit of that kind.

    Pruning runs at most every ``every_s`` seconds, over the devices written since the last run
    (``Store.prune`` runs it at once). The audit log and rollout rows are never pruned."""

    latency_rows: int = 1000  # newest p95 figures per device
    events: int = 500  # newest deployment events per device (events not yet applied are kept)
    max_age_s: float = 30 * DAY_S  # older latency rows and events go, whatever their count
    every_s: float = 60.0


class Lease(Protocol):
    """The right to drive rollouts: exactly one controller holds it at a time."""

    @property
    def replicated(self) -> bool:
        """Whether several controllers may run on this store (so ingest is shared between them)."""

    def check(self) -> bool:
        """Take or keep the lease now; False while another controller holds it or the store is unreachable."""

    def release(self) -> None: ...


class Store(Protocol):
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
    def close(self) -> None: ...
    # -- devices ------------------------------------------------------------------------------
    def upsert_device(self, device_id: str, **fields: Any) -> None:
        """Set device fields; a ``*_at`` key of :data:`GUARDED` makes its fields apply only if not older."""
    def devices(self) -> list[DeviceRow]: ...
    def device(self, device_id: str) -> DeviceRow | None: ...
    def add_latency(self, device_id: str, model: str, version: int, p95_ms: float, source: str, ts: float) -> None: ...
    def latency(self, device_id: str, model: str | None = None, version: int | None = None,
                since: float = 0.0, limit: int = 500) -> list[LatencyPoint]: ...
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
    def request(self, rollout_id: str, action: str) -> None: ...
    def take_requests(self) -> list[tuple[str, str]]: ...
