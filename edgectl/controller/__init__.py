"""The fleet control plane: records, store, rollout lifecycle, planner, gates and the engine.

The controller service (:mod:`edgectl.controller.service`) is imported on its own: it pulls in
MQTT and the artifact server, which the planning side does not need.
"""

from __future__ import annotations

from edgectl.controller.engine import Engine
from edgectl.controller.gates import DeviceFacts, Gate, GateResult, parse_gate
from edgectl.controller.lifecycle import REQUESTS, TRANSITIONS, IllegalTransition, RolloutEvent, advance
from edgectl.controller.planner import Plan, check_variants, choose_variant, parse_waves, plan_rollout, variant_id, variant_label
from edgectl.controller.records import (
    ACTIVE,
    FINAL,
    DeviceRecord,
    DeviceStatus,
    PackageRef,
    Phase,
    RolloutDevice,
    RolloutRow,
    RolloutSpec,
    RolloutStatus,
)
from edgectl.controller.selector import Selector, parse_selector
from edgectl.controller.store import SqliteStore, Store
from edgectl.controller.submit import RolloutOptions, submit_rollout

__all__ = [
    "ACTIVE",
    "FINAL",
    "REQUESTS",
    "TRANSITIONS",
    "DeviceFacts",
    "DeviceRecord",
    "DeviceStatus",
    "Engine",
    "Gate",
    "GateResult",
    "IllegalTransition",
    "PackageRef",
    "Phase",
    "Plan",
    "RolloutDevice",
    "RolloutEvent",
    "RolloutOptions",
    "RolloutRow",
    "RolloutSpec",
    "RolloutStatus",
    "Selector",
    "SqliteStore",
    "Store",
    "advance",
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
