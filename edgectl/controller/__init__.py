"""The fleet control plane: store, rollout planner, gates and the controller service."""

from __future__ import annotations

from edgectl.controller.engine import ACTIVE, FINAL, REQUESTS, Engine
from edgectl.controller.gates import DeviceFacts, Gate, GateResult, parse_gate
from edgectl.controller.planner import Plan, check_variants, choose_variant, parse_waves, plan_rollout, variant_id, variant_label
from edgectl.controller.selector import Selector, parse_selector
from edgectl.controller.store import DeviceRow, RolloutDevice, RolloutRow, SqliteStore, Store
from edgectl.controller.submit import RolloutOptions, submit_rollout

__all__ = [
    "ACTIVE",
    "FINAL",
    "REQUESTS",
    "DeviceFacts",
    "DeviceRow",
    "Engine",
    "Gate",
    "GateResult",
    "Plan",
    "RolloutDevice",
    "RolloutOptions",
    "RolloutRow",
    "Selector",
    "SqliteStore",
    "Store",
    "check_variants",
    "choose_variant",
    "parse_gate",
    "parse_selector",
    "parse_waves",
    "plan_rollout",
    "submit_rollout",
    "variant_id",
    "variant_label",
]
