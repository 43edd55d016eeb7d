"""The fleet domain layer: what ``edgectl`` commands (and a future REST API) do, without the printing.

``edgectl/cli/*`` parses arguments, calls these functions and prints what they return; an API
handler does the same with JSON. Errors are :mod:`edgecore.errors` exceptions with exit codes.
"""

from __future__ import annotations

from edgectl.fleet.approvals import ApprovalRefused, approve_rollout, reject_rollout
from edgectl.fleet.groups import (
    add_members,
    create_group,
    delete_group,
    device_chooser,
    group_detail,
    group_list,
    remove_members,
    update_group,
)
from edgectl.fleet.inventory import device_detail, device_page, fleet_devices, fleet_summary, open_store, store_devices
from edgectl.fleet.packages import load_package, package_keys, upload_package
from edgectl.fleet.progress import rollout_gates, rollout_status, rollout_waves, waiting_for_data
from edgectl.fleet.rollouts import (
    FleetRequest,
    check_done,
    check_downgrade,
    deploy_fleet,
    deploy_uploaded,
    plan_fleet_rollout,
    request_action,
    rollout_options,
    rollout_summary,
    wait_rollout,
)

__all__ = [
    "ApprovalRefused",
    "FleetRequest",
    "add_members",
    "approve_rollout",
    "check_done",
    "check_downgrade",
    "create_group",
    "delete_group",
    "deploy_fleet",
    "deploy_uploaded",
    "device_chooser",
    "device_detail",
    "device_page",
    "fleet_devices",
    "fleet_summary",
    "group_detail",
    "group_list",
    "load_package",
    "open_store",
    "package_keys",
    "plan_fleet_rollout",
    "reject_rollout",
    "remove_members",
    "request_action",
    "rollout_gates",
    "rollout_options",
    "rollout_status",
    "rollout_summary",
    "rollout_waves",
    "store_devices",
    "update_group",
    "upload_package",
    "wait_rollout",
    "waiting_for_data",
]
