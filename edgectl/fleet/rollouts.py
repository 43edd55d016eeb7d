"""Staged rollouts as the operator sees them: plan and submit, summarise, steer, follow."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from edgecore.errors import NotFoundError, OperationFailed, UserError
from edgecore.protocol.envelope import TrustedKeys
from edgectl.artifacts.urls import check_artifact_urls
from edgectl.config import EdgectlConfig
from edgectl.controller.composition import Composer
from edgectl.controller.gates import parse_duration, parse_gate, parse_rate
from edgectl.controller.lifecycle import REQUESTS
from edgectl.controller.maintenance import OPENS_AT, WINDOWS, ZONE, noted_windows, window_data
from edgectl.controller.planner import Plan, Screening, package_ref, parse_waves, plan_rollout, variant_id
from edgectl.controller.records import FINAL, DeviceRecord, DeviceStatus, RolloutSpec, RolloutStatus
from edgectl.controller.schedule import iso_utc, parse_start_at
from edgectl.controller.screen import Screen
from edgectl.controller.store import Store
from edgectl.controller.submit import RolloutOptions, submit_rollout
from edgectl.fleet.approvals import approval_reason
from edgectl.fleet.inventory import fleet_records, open_store, store_records
from edgectl.fleet.packages import load_package
from edgectl.package import Package, read_package

__all__ = [
    "FleetRequest",
    "check_done",
    "check_downgrade",
    "deploy_fleet",
    "deploy_uploaded",
    "plan_fleet_rollout",
    "request_action",
    "rollout_options",
    "rollout_summary",
    "wait_rollout",
]

SHADOW_GATE = "agreement >= 0.99"


@dataclass(frozen=True)
class FleetRequest:
    """``deploy --fleet`` as the operator typed it; :func:`rollout_options` checks it."""

    artifacts: Sequence[Path]
    selector: str
    waves: str = "1,10%,50%,100%"
    max_failure: str = "5%"
    bake: str = "10m"
    gates: Sequence[str] = field(default_factory=tuple)
    shadow: bool = False
    allow_downgrade: bool = False
    dry_run: bool = False
    artifact_urls: Sequence[str] = field(default_factory=tuple)  # --artifact-url, repeatable
    max_per_minute: int = 0  # --max-per-minute: pace each wave
    allow_no_data: bool = False  # --allow-no-data: a gate without data does not hold a baked wave
    start_at: str | None = None  # --start-at: ISO 8601 with an offset; checked against the store's clock when recorded
    deadline: str | None = None  # --deadline: ISO 8601 with an offset; from then on maintenance windows hold no device


def rollout_options(request: FleetRequest, wave_timeout_s: float) -> RolloutOptions:
    """Parse and check the request's waves, rates, durations and gates; UserError names what is wrong."""
    parse_waves(request.waves)
    for g in request.gates:
        parse_gate(g)
    gates = list(request.gates)
    if request.shadow and not any("agreement" in g for g in gates):
        gates.append(SHADOW_GATE)
    max_failure, bake_s = parse_rate(request.max_failure, "--max-failure"), parse_duration(request.bake, "--bake")
    return RolloutOptions(request.selector, max_failure, bake_s, gates, request.shadow, request.allow_downgrade, wave_timeout_s,
                          artifact_urls=check_artifact_urls(request.artifact_urls, len(request.artifacts)),
                          max_per_minute=_pace(request.max_per_minute), allow_no_data=request.allow_no_data)


def _pace(max_per_minute: int) -> int:
    if max_per_minute < 0:
        raise UserError(f"--max-per-minute {max_per_minute}: give a count of devices a minute (0: no pacing)")
    return max_per_minute


def check_downgrade(plan: Plan, devices: Sequence[dict[str, Any]], allow: bool) -> None:
    """Refuse a plan that gives a device a lower version of the model it runs, unless asked to."""
    by_id = {d["device_id"]: d for d in devices}
    older = []
    for d in plan.devices:
        m = plan.packages[d.variant].manifest if d.variant else None
        current = next((s for s in by_id[d.device_id].get("models") or () if m and s["name"] == m.name), None)
        if m and current is not None and (current.get("version") or 0) > m.version:
            older.append(f"{d.device_id} runs {m.name} v{current['version']}")
    if older and not allow:
        raise UserError(f"refusing a downgrade ({'; '.join(older[:5])}): pass --allow-downgrade to roll back on purpose")


def plan_fleet_rollout(request: FleetRequest, options: RolloutOptions, packages: Sequence[Package],
                       records: Sequence[DeviceRecord], store: Store) -> Plan:
    """The plan, each device screened against the set the rollout makes for it (its agent's schema, its memory)."""
    if not records:
        raise UserError(f"selector {request.selector!r} matches no device (see `edgectl devices`)")
    devices = [r.to_dict() for r in records]
    plan = plan_rollout(devices, packages, request.waves, options.bake_s, options.max_per_minute,
                        _screening(store, records, packages))
    check_downgrade(plan, devices, request.allow_downgrade)
    return plan


def _screening(store: Store, records: Sequence[DeviceRecord], packages: Sequence[Package]) -> Screening:
    """Each device's verdict on the set this rollout would make for it (controller.screen), by the store's rollouts."""
    composer = Composer(store)
    screen = Screen(store, composer)
    screen.refresh(store.devices())
    refs = {variant_id(p): package_ref(p, p.path) for p in packages}
    spec = RolloutSpec("", tuple(refs.values()), 0, 0.0, 0.0, (), 0.0)
    by_id = {r.id: r for r in records}

    def verdict(device: dict[str, Any], package: Package) -> tuple[str, str]:
        found = screen.planned(spec, by_id[device["device_id"]], refs[variant_id(package)], 0)
        return found.refusal, found.note
    return verdict


def deploy_fleet(request: FleetRequest, broker: str | None, config: EdgectlConfig,
                 actor: str = "operator") -> tuple[Plan, str | None]:
    """Plan the rollout and, unless a dry run, record it for the controller: (plan, rollout id or None)."""
    options = rollout_options(request, config.deploy.timeout_s)
    with tempfile.TemporaryDirectory(prefix="edgectl-fleet-") as tmp:
        packages = [load_package(path, None, None, _workdir(tmp, i)) for i, path in enumerate(request.artifacts)]
        records = fleet_records(broker, config, request.selector)
        return _record(request, options, packages, records, open_store(config, must_exist=False), actor,
                       config.controller.approval.min_devices)


def deploy_uploaded(request: FleetRequest, store: Store, trusted: TrustedKeys, wave_timeout_s: float,
                    actor: str, approval_min_devices: int = 0) -> tuple[Plan, str | None]:
    """``deploy_fleet`` for the REST API: packages already uploaded (kept files, checked again against
    ``trusted``), devices from the controller store; the rollout audited as ``actor``."""
    options = rollout_options(request, wave_timeout_s)
    with tempfile.TemporaryDirectory(prefix="edgectl-fleet-") as tmp:
        packages = [read_package(path, trusted, _workdir(tmp, i)) for i, path in enumerate(request.artifacts)]
        return _record(request, options, packages, store_records(store, request.selector), store, actor,
                       approval_min_devices)


def _workdir(tmp: str, i: int) -> Path:
    path = Path(tmp) / str(i)
    path.mkdir()
    return path


def _record(request: FleetRequest, options: RolloutOptions, packages: Sequence[Package], records: Sequence[DeviceRecord],
            store: Store, actor: str, min_devices: int) -> tuple[Plan, str | None]:
    """Plan, then (unless a dry run) record: with its start time (not in the past by the store's clock) and,
    where the two-person rule asks for one, waiting for approval."""
    start_at = None if request.start_at is None else parse_start_at(request.start_at, store.now())
    deadline = None if request.deadline is None else parse_start_at(request.deadline, store.now(), "deadline")
    if deadline is not None and start_at is not None and deadline <= start_at:
        raise UserError(f"deadline: {request.deadline!r} is not after the start time {request.start_at!r}")
    configured = {c.device_id: c.settings.maintenance_windows for c in store.device_configs()
                  if c.settings.maintenance_windows is not None}
    windows = window_data(store.groups(), records, configured)
    plan = noted_windows(plan_fleet_rollout(request, options, packages, records, store), windows, deadline,
                         start_at or store.now())
    if request.dry_run:
        return plan, None
    approval = approval_reason(store, request.selector, plan, min_devices)
    return plan, submit_rollout(store, plan, replace(options, start_at=start_at, approval=approval, deadline=deadline,
                                                     windows=windows), actor)


def rollout_summary(store: Store, rollout_id: str) -> dict[str, Any]:
    """The rollout and every device's part in it, as JSON-ready data."""
    rollout = store.rollout(rollout_id)
    if rollout is None:
        raise NotFoundError(f"no rollout {rollout_id!r} (see `edgectl rollout list`)")
    rows = store.rollout_devices(rollout_id)
    spec = rollout.spec
    return {
        "id": rollout.id, "status": rollout.status.value, "wave": rollout.wave, "waves": spec.wave_count,
        "phase": rollout.phase.value, "reason": rollout.reason, "created": rollout.created, "selector": spec.selector,
        "gates": list(spec.gates), "bake_s": spec.bake_s, "max_failure": spec.max_failure,
        "max_per_minute": spec.max_per_minute, "allow_no_data": spec.allow_no_data,
        "start_at": None if spec.start_at is None else iso_utc(spec.start_at), "approval": spec.approval or None,
        "created_by": spec.created_by or None, "deadline": None if spec.deadline is None else iso_utc(spec.deadline),
        "packages": [p.label for p in spec.packages],
        "devices": [{"device_id": r.device_id, "wave": r.wave, "status": r.status.value, "state": r.state, "detail": r.detail,
                     "variant": spec.package(r.variant).label if r.variant else None,
                     "backend": r.data.get("backend"), "health_p95_ms": r.data.get("health_p95_ms"),
                     "shadow": r.data.get("shadow"), "windows": r.data.get(WINDOWS), "timezone": r.data.get(ZONE),
                     "window_opens_at": r.data.get(OPENS_AT)} for r in rows],
        "skipped": [{"device_id": r.device_id, "reason": r.detail} for r in rows if r.status == DeviceStatus.SKIPPED],
    }


def request_action(store: Store, rollout_id: str, action: str, actor: str = "operator") -> None:
    """Queue pause, resume, abort or retry-failed for the controller; refuse one that does not apply now."""
    if action not in REQUESTS:
        raise UserError(f"unknown rollout action {action!r} (known: {', '.join(REQUESTS)})")
    status = rollout_summary(store, rollout_id)["status"]
    if status not in REQUESTS[action]:
        applies = " or ".join(s.value for s in REQUESTS[action])
        raise UserError(f"cannot {action} rollout {rollout_id}: it is {status} ({action} applies to {applies})")
    store.request(rollout_id, action)
    store.audit(f"{action} requested", "", rollout_id, actor=actor)


def wait_rollout(store: Store, rollout_id: str, on_update: Callable[[dict[str, Any]], None] | None = None,
                 timeout_s: float = 24 * 3600, poll_s: float = 0.5) -> dict[str, Any]:
    """Poll until the rollout ends (or ``timeout_s`` passes); return its last summary."""
    deadline = time.monotonic() + timeout_s
    summary = rollout_summary(store, rollout_id)
    while summary["status"] not in FINAL and time.monotonic() < deadline:
        time.sleep(poll_s)
        summary = rollout_summary(store, rollout_id)
        if on_update is not None:
            on_update(summary)
    return summary


def check_done(summary: dict[str, Any]) -> None:
    """Raise OperationFailed (exit 5) unless the summarised rollout ended ``done``."""
    if summary["status"] != RolloutStatus.DONE:
        raise OperationFailed(f"rollout {summary['id']} ended {summary['status']}: {summary['reason']}")
