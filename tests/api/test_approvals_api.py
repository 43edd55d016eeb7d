"""Scheduled rollouts and the two-person rule through the REST API and the CLI, against a real controller, Mosquitto
and light agents: bad start times named and never stored, a protected group's rollout waiting for a second operator,
the creator refused, a rejection with its reason, and every step in the audit log with its actor."""

from __future__ import annotations

import json
import time
from typing import Any

from tests.api.conftest import ApiPlane
from tests.api.test_fleet_api import _ended, _online, _upload
from tests.fleet import wait_for


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(ts))


def _status(api: ApiPlane, rollout_id: str) -> dict[str, Any]:
    body: dict[str, Any] = api.call("GET", f"/api/v1/rollouts/{rollout_id}", token="viewer").body
    return body


def test_scheduled_and_approved_rollouts_with_their_audit(api: ApiPlane) -> None:
    api.agents(2, prefix="plant")
    _online(api, 2)
    variant = _upload(api, "det", 1)["variant"]
    body = {"packages": [variant], "selector": "all", "waves": "100%", "bake": "1s"}
    for start_at in ("tomorrow", "2020-01-01T00:00:00+00:00", "2099-01-01T00:00:00", _iso(time.time() - 5)):
        refused = api.call("POST", "/api/v1/rollouts", {**body, "start_at": start_at})
        assert refused.status == 400 and refused.body["error"]["field"] == "start_at", (start_at, refused.body)
    assert api.call("POST", "/api/v1/rollouts", {**body, "start_at": 5}).body["error"]["field"] == "start_at"
    assert api.call("GET", "/api/v1/rollouts", token="viewer").body["total"] == 0  # nothing stored

    # A protected group: its rollout waits for a second operator, then for its start time.
    group = {"name": "plant", "kind": "static", "members": ["plant-000", "plant-001"], "protected": "yes"}
    assert api.call("POST", "/api/v1/groups", group).body["error"]["field"] == "protected"
    made = api.call("POST", "/api/v1/groups", {**group, "protected": True})
    assert made.status == 201 and made.body["protected"] is True
    created = api.call("POST", "/api/v1/rollouts", {**body, "selector": "group:plant", "start_at": _iso(time.time() + 4)})
    assert created.status == 201, created.body
    first = created.body["rollout_id"]
    shown = _status(api, first)
    assert shown["status"] == "awaiting-approval" and shown["approval"] == "targets protected group plant"
    assert shown["created_by"] == "api:operator-user"
    own = api.call("POST", f"/api/v1/rollouts/{first}/approve")
    assert own.status == 403 and "two-person rule" in own.body["error"]["message"]
    assert api.call("POST", f"/api/v1/rollouts/{first}/approve", token="viewer").status == 403
    assert api.call("POST", "/api/v1/rollouts/r-none/approve", token="admin").status == 404
    time.sleep(1.5)
    assert _status(api, first)["status"] == "awaiting-approval"  # never started by the controller without approval
    approved = api.call("POST", f"/api/v1/rollouts/{first}/approve", token="admin")
    assert approved.status == 200 and approved.body["status"] == "scheduled"
    assert api.call("POST", f"/api/v1/rollouts/{first}/approve", token="admin").status == 409
    assert _status(api, first)["status"] == "scheduled" and all(d["status"] == "planned" for d in _status(api, first)["devices"])
    assert _ended(api, first)["status"] == "done"

    # A rejection with its reason ends the next one; the CLI rejects, nothing is sent.
    second = api.call("POST", "/api/v1/rollouts", {**body, "selector": "group:plant"}).body["rollout_id"]
    assert api.call("POST", f"/api/v1/rollouts/{second}/reject", {}).body["error"]["field"] == "reason"
    assert api.call("POST", f"/api/v1/rollouts/{second}/reject", {"reason": " "}).body["error"]["field"] == "reason"
    no_reason = api.edgectl("rollout", "reject", second)
    assert no_reason.returncode == 2 and "--reason" in no_reason.stderr
    rejected = json.loads(api.edgectl("rollout", "reject", second, "--reason", "not before the audit", "--json",
                                      check=True).stdout)
    assert rejected["status"] == "rejected" and rejected["reason"].endswith(": not before the audit")
    assert api.call("POST", f"/api/v1/rollouts/{second}/approve", token="admin").status == 409
    assert {d["status"] for d in _status(api, second)["devices"]} == {"cancelled"}
    third = api.call("POST", "/api/v1/rollouts", {**body, "selector": "group:plant", "start_at": _iso(time.time() + 3600)})
    approved_cli = json.loads(api.edgectl("rollout", "approve", third.body["rollout_id"], "--json", check=True).stdout)
    assert approved_cli["status"] == "scheduled" and approved_cli["approved_by"].startswith("cli:")
    assert api.call("POST", f"/api/v1/rollouts/{third.body['rollout_id']}/abort").status == 202
    assert _ended(api, third.body["rollout_id"])["status"] == "aborted"
    unprotected = json.loads(api.edgectl("group", "protect", "plant", "--off", "--json", check=True).stdout)
    assert unprotected["protected"] is False

    def steps(rollout_id: str) -> list[tuple[str, str]]:
        entries = api.call("GET", f"/api/v1/audit?rollout_id={rollout_id}", token="viewer").body["entries"]
        return [(e["action"], e["actor"]) for e in sorted(entries, key=lambda e: e["id"])
                if e["action"].startswith("rollout")]
    assert steps(first)[:4] == [("rollout created", "api:operator-user"), ("rollout awaiting approval", "api:operator-user"),
                                ("rollout approved", "api:admin-user"), ("rollout started", "controller")]
    wait_for(lambda: ("rollout done", "controller") in steps(first), 30, "the done entry")
    assert steps(second)[0] == ("rollout created", "api:operator-user")
    assert steps(second)[-1][0] == "rollout rejected" and steps(second)[-1][1].startswith("cli:")
