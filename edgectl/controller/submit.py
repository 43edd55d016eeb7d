"""Turning a plan into a stored rollout that the controller service then drives."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from edgectl.controller.gates import parse_gate
from edgectl.controller.planner import Plan, package_ref
from edgectl.controller.records import DeviceStatus, Phase, RolloutDevice, RolloutRow, RolloutSpec, RolloutStatus
from edgectl.controller.schedule import iso_utc
from edgectl.controller.store import Store

__all__ = ["RolloutOptions", "submit_rollout"]

DEFAULT_SILENCE = "silence <= 60s"


@dataclass(frozen=True)
class RolloutOptions:
    """The operator's choices for one rollout, parsed and checked (``deploy --fleet`` flags, or an API body)."""

    selector: str
    max_failure: float
    bake_s: float
    gates: Sequence[str]
    shadow: bool = False
    allow_downgrade: bool = False
    wave_timeout_s: float = 600.0
    artifact_urls: tuple[str, ...] = ()  # checked by edgectl.artifacts.urls.check_artifact_urls
    max_per_minute: int = 0  # pace: desired states sent a minute within a wave (0: all at once)
    allow_no_data: bool = False  # a gate without data does not hold a baked wave (recorded in the spec)
    start_at: float | None = None  # the rollout waits, ``scheduled``, until then (checked by controller.schedule)
    approval: str = ""  # why it must wait for a second operator's approval ("": it need not)
    deadline: float | None = None  # forced-update deadline: windows hold no device back from then on
    windows: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # device id -> row data (controller.maintenance)


def _gates(options: RolloutOptions) -> tuple[list[str], float]:
    """The user's gates plus the defaults: failure rate from --max-failure, silence 60 s."""
    parsed = [parse_gate(g) for g in options.gates]
    texts = [g.text for g in parsed]
    if not any(g.metric == "failure_rate" for g in parsed):
        texts.append(f"failure_rate <= {options.max_failure * 100:g}%")
    silence = next((g for g in parsed if g.metric == "silence"), None) or parse_gate(DEFAULT_SILENCE)
    if silence.text not in texts:
        texts.append(silence.text)
    return texts, silence.threshold


def rollout_spec(store: Store, plan: Plan, options: RolloutOptions) -> RolloutSpec:
    """The spec to record: packages kept by the store, the defaults added to the gates."""
    packages = [package_ref(package, store.keep_package(variant, package.path)) for variant, package in plan.packages.items()]
    gates, silence_s = _gates(options)
    return RolloutSpec(options.selector, tuple(packages), plan.waves, options.max_failure, options.bake_s, tuple(gates),
                       silence_s, options.shadow, options.allow_downgrade, options.wave_timeout_s,
                       artifact_urls=options.artifact_urls, max_per_minute=options.max_per_minute,
                       allow_no_data=options.allow_no_data, start_at=options.start_at, approval=options.approval,
                       deadline=options.deadline)


def submit_rollout(store: Store, plan: Plan, options: RolloutOptions, actor: str = "operator") -> str:
    """Keep the packages, record the rollout and its devices; return its id (audited as ``actor``)."""
    rollout_id = f"r-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    spec = replace(rollout_spec(store, plan, options), created_by=actor)
    status = _first_status(plan, options)
    rollout = RolloutRow(rollout_id, time.time(), status, spec, wave=1, phase=Phase.START)
    rows = [RolloutDevice(rollout_id, d.device_id, d.wave, d.variant or "", DeviceStatus.PLANNED,
                          data=dict(options.windows.get(d.device_id, {}))) for d in plan.devices]
    rows += [RolloutDevice(rollout_id, d.device_id, 0, "", DeviceStatus.SKIPPED, detail=d.reason) for d in plan.skipped]
    rows += [RolloutDevice(rollout_id, d.device_id, 0, d.variant or "", DeviceStatus.REFUSED, detail=d.reason)
             for d in plan.refused]
    store.create_rollout(rollout, rows)
    store.audit("rollout created", f"{len(plan.devices)} device(s) in {plan.waves} wave(s), {len(plan.skipped)} skipped, "
                f"{len(plan.refused)} refused; "
                f"gates: {'; '.join(spec.gates)}" + ("; promotion without data allowed (--allow-no-data)"
                                                      if spec.allow_no_data else ""), rollout_id, actor=actor)
    for d in plan.refused:
        store.audit("device refused", d.reason, rollout_id, d.device_id, actor=actor)
    windowed = sum(1 for d in plan.devices if d.device_id in options.windows)
    if windowed or options.deadline is not None:
        deadline = f"; forced from {iso_utc(options.deadline)}" if options.deadline is not None else ""
        store.audit("rollout windows", f"{windowed} device(s) install only inside their groups' maintenance "
                    f"windows{deadline}", rollout_id, actor=actor)
    if status is RolloutStatus.AWAITING_APPROVAL:
        store.audit("rollout awaiting approval", f"{options.approval}: a second operator approves or rejects it",
                    rollout_id, actor=actor)
    elif status is RolloutStatus.SCHEDULED and options.start_at is not None:
        store.audit("rollout scheduled", f"starts at {iso_utc(options.start_at)}", rollout_id, actor=actor)
    return rollout_id


def _first_status(plan: Plan, options: RolloutOptions) -> RolloutStatus:
    """Nothing to send: done; else awaiting approval when it needs one, scheduled when it has a start time, else running."""
    if not plan.waves:
        return RolloutStatus.DONE
    if options.approval:
        return RolloutStatus.AWAITING_APPROVAL
    return RolloutStatus.SCHEDULED if options.start_at is not None else RolloutStatus.RUNNING
