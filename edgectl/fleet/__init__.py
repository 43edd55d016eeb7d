"""The fleet domain layer: what ``edgectl`` commands (and a future REST API) do, without the printing.

``edgectl/cli/*`` parses arguments, calls these functions and prints what they return; an API
handler does the same with JSON. Errors are :mod:`agent.errors` exceptions with exit codes.
"""

from __future__ import annotations

from edgectl.fleet.inventory import device_detail, fleet_devices, open_store
from edgectl.fleet.packages import load_package, package_keys
from edgectl.fleet.rollouts import (
    FleetRequest,
    check_done,
    check_downgrade,
    deploy_fleet,
    plan_fleet_rollout,
    request_action,
    rollout_options,
    rollout_summary,
    wait_rollout,
)

__all__ = [
    "FleetRequest",
    "check_done",
    "check_downgrade",
    "deploy_fleet",
    "device_detail",
    "fleet_devices",
    "load_package",
    "open_store",
    "package_keys",
    "plan_fleet_rollout",
    "request_action",
    "rollout_options",
    "rollout_summary",
    "wait_rollout",
]
