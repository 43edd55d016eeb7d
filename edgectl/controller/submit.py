"""Turning a plan into a stored rollout that the controller service then drives."""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from edgectl.controller.gates import parse_gate
from edgectl.controller.planner import Plan, variant_label
from edgectl.controller.store import RolloutDevice, RolloutRow, SqliteStore

__all__ = ["RolloutOptions", "submit_rollout"]

DEFAULT_SILENCE = "silence <= 60s"


@dataclass(frozen=True)
class RolloutOptions:
    selector: str
    max_failure: float
    bake_s: float
    gates: Sequence[str]
    shadow: bool = False
    allow_downgrade: bool = False
    wave_timeout_s: float = 600.0


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


def submit_rollout(store: SqliteStore, plan: Plan, options: RolloutOptions) -> str:
    """Copy the packages next to the store, record the rollout and its devices; return its id."""
    rollout_id = f"r-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    keep = store.path.parent / "packages"
    keep.mkdir(parents=True, exist_ok=True)
    packages: list[dict[str, Any]] = []
    for variant, package in plan.packages.items():
        path = keep / f"{variant}.edgepkg"
        if not path.exists():
            shutil.copyfile(package.path, path)
        m = package.manifest
        packages.append({"variant": variant, "artifact_id": m.artifact_id, "name": m.name, "version": m.version,
                         "target": m.target.name, "label": variant_label(package), "path": str(path), "size": m.payload.size})
    gates, silence_s = _gates(options)
    spec = {
        "selector": options.selector, "packages": packages, "wave_count": plan.waves, "max_failure": options.max_failure,
        "bake_s": options.bake_s, "gates": gates, "silence_s": silence_s, "shadow": options.shadow,
        "allow_downgrade": options.allow_downgrade, "wave_timeout_s": options.wave_timeout_s,
    }
    rollout = RolloutRow(rollout_id, time.time(), "running" if plan.waves else "done", spec, wave=1, phase="start")
    rows = [RolloutDevice(rollout_id, d.device_id, d.wave, d.variant or "", "planned") for d in plan.devices]
    rows += [RolloutDevice(rollout_id, d.device_id, 0, "", "skipped", detail=d.reason) for d in plan.skipped]
    store.create_rollout(rollout, rows)
    store.audit("rollout created", f"{len(plan.devices)} device(s) in {plan.waves} wave(s), {len(plan.skipped)} skipped; gates: {'; '.join(gates)}",
                rollout_id, actor="operator")
    return rollout_id
