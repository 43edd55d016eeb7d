"""The fleet control plane: store, rollout planner, gates and the controller service."""

from __future__ import annotations

from edgectl.controller.engine import ACTIVE, Engine
from edgectl.controller.gates import DeviceFacts, Gate, GateResult, parse_gate
from edgectl.controller.planner import Plan, choose_variant, parse_waves, plan_rollout
from edgectl.controller.selector import Selector, parse_selector
from edgectl.controller.store import DeviceRow, RolloutDevice, RolloutRow, SqliteStore, Store
from edgectl.controller.submit import RolloutOptions, default_store_path, submit_rollout

__all__ = [
    "ACTIVE",
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
    "choose_variant",
    "default_store_path",
    "parse_gate",
    "parse_selector",
    "parse_waves",
    "plan_rollout",
    "submit_rollout",
]
