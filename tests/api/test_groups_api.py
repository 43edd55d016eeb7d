"""Device groups through the REST API and the CLI, against a real controller, Mosquitto and light agents:
bad input named and never stored, changes audited with the actor, and rollouts to a group."""

from __future__ import annotations

import json
from typing import Any

from tests.api.conftest import ApiPlane
from tests.api.test_fleet_api import _ended, _online, _upload


def _groups(api: ApiPlane) -> list[str]:
    return [g["name"] for g in api.call("GET", "/api/v1/groups", token="viewer").body["groups"]]


def test_groups_api_bad_input_audit_and_a_rollout_to_a_group(api: ApiPlane) -> None:
    api.agents(2, prefix="lobby", tags={"site": "lobby"})
    api.agents(1, prefix="dock", tags={"site": "dock"})
    _online(api, 3)
    dynamic = {"name": "lobby", "kind": "dynamic", "query": "site=lobby", "description": "the lobby cameras"}
    assert api.call("POST", "/api/v1/groups", dynamic, token="viewer").status == 403
    bad: dict[str, dict[str, Any]] = {
        "name": {"name": "Lobby!", "kind": "static"},
        "kind": {"name": "lobby", "kind": "sometimes"},
        "members[1]": {"name": "pilot", "kind": "static", "members": ["lobby-000", "ghost"]},
        "members": {"name": "lobby", "kind": "dynamic", "query": "site=lobby", "members": ["lobby-000"]},
        "query": {"name": "lobby", "kind": "dynamic", "query": "colour=red"},
        "colour": {"name": "lobby", "kind": "static", "colour": "red"},
    }
    for field, body in bad.items():
        answer = api.call("POST", "/api/v1/groups", body)
        assert answer.status == 400 and answer.body["error"]["field"] == field, (field, answer.body)
    assert _groups(api) == []

    assert api.call("POST", "/api/v1/groups", dynamic).status == 201
    static = api.call("POST", "/api/v1/groups", {"name": "pilot", "kind": "static", "members": ["dock-000"]})
    assert static.status == 201 and static.body["created_by"] == "api:operator-user"
    taken = api.call("POST", "/api/v1/groups", {"name": "pilot", "kind": "static"})
    assert taken.status == 409 and taken.body["error"]["field"] == "name"
    shown = api.call("GET", "/api/v1/groups/lobby", token="viewer").body
    assert [d["device_id"] for d in shown["devices"]] == ["lobby-000", "lobby-001"] and shown["query"] == "site=lobby"
    assert api.call("GET", "/api/v1/groups/nope", token="viewer").status == 404
    assert api.call("PATCH", "/api/v1/groups/pilot", {}).body["error"]["field"] == "body"
    assert api.call("PATCH", "/api/v1/groups/pilot", {"members": ["ghost"]}).body["error"]["field"] == "members[0]"
    changed = api.call("PATCH", "/api/v1/groups/pilot", {"members": ["dock-000", "lobby-001"]})
    assert changed.status == 200 and changed.body["members"] == ["dock-000", "lobby-001"]

    variant = _upload(api, "det", 1)["variant"]
    body = {"packages": [variant], "selector": "group:lobby", "waves": "100%", "bake": "1s"}
    plan = api.call("POST", "/api/v1/rollouts", {**body, "dry_run": True}).body["plan"]
    assert sorted(d["device_id"] for w in plan["waves"] for d in w["devices"]) == ["lobby-000", "lobby-001"]
    created = api.call("POST", "/api/v1/rollouts", body)
    assert created.status == 201, created.body
    ended = _ended(api, created.body["rollout_id"])
    assert ended["status"] == "done" and sorted(d["device_id"] for d in ended["devices"]) == ["lobby-000", "lobby-001"]
    for selector, message in (("group:nope", "no device group 'nope'"), ("group:empty", "matches no device")):
        api.call("POST", "/api/v1/groups", {"name": "empty", "kind": "static"})
        refused = api.call("POST", "/api/v1/rollouts", {**body, "selector": selector})
        assert refused.status == 400 and refused.body["error"]["field"] == "selector", refused.body
        assert message in refused.body["error"]["message"]

    running = api.call("POST", "/api/v1/rollouts", {**body, "selector": "group:pilot", "bake": "10m"}).body["rollout_id"]
    conflict = api.call("DELETE", "/api/v1/groups/pilot")
    assert conflict.status == 409 and running in conflict.body["error"]["message"]
    assert api.call("POST", f"/api/v1/rollouts/{running}/abort").status == 202
    _ended(api, running)
    assert api.call("DELETE", "/api/v1/groups/pilot", token="viewer").status == 403
    assert api.call("DELETE", "/api/v1/groups/pilot").body == {"deleted": "pilot"}
    audit = [(e["action"], e["actor"]) for e in api.call("GET", "/api/v1/audit", token="viewer").body["entries"]]
    assert [a for a in audit if a[0].startswith("group")] == [
        ("group created", "api:operator-user"), ("group created", "api:operator-user"), ("group changed", "api:operator-user"),
        ("group created", "api:operator-user"), ("group deleted", "api:operator-user")]

    # The CLI on the same store: tables, --json, one-line errors, and deploy --fleet group:NAME.
    made = json.loads(api.edgectl("group", "create", "docks", "--query", "site=dock", "--json", check=True).stdout)
    assert made["kind"] == "dynamic" and made["created_by"].startswith("cli")
    api.edgectl("group", "create", "few", "--member", "lobby-000", check=True)
    assert "2 member(s)" in api.edgectl("group", "add", "few", "dock-000", check=True).stdout
    shown = json.loads(api.edgectl("group", "show", "few", "--json", check=True).stdout)
    assert [d["device_id"] for d in shown["devices"]] == ["dock-000", "lobby-000"]
    listed = api.edgectl("group", "list", check=True).stdout
    assert "docks" in listed and "site=dock" in listed and "the lobby cameras" in listed
    bad_name = api.edgectl("group", "create", "Bad Name")
    assert bad_name.returncode == 2 and "name: 'Bad Name' is not a group name" in bad_name.stderr + bad_name.stdout
    unknown = api.edgectl("group", "add", "few", "ghost")
    assert unknown.returncode == 2 and "members[0]: no device 'ghost'" in unknown.stderr + unknown.stdout
    dry = json.loads(api.edgectl("deploy", str(api.package("det", 2)), "--fleet", "group:docks", "--dry-run", "--json",
                                 check=True).stdout)
    assert [d["device_id"] for w in dry["waves"] for d in w["devices"]] == ["dock-000"]
    api.edgectl("group", "delete", "few", check=True)
    assert "few" not in _groups(api)


def test_maintenance_windows_and_deadlines_refuse_bad_input_naming_the_field(api: ApiPlane) -> None:
    """Windows on groups and a rollout's forced-update deadline, over the API and the CLI: bad input is a 400 (exit 2)
    naming the field, and nothing is stored."""
    api.agents(1, prefix="night")
    _online(api, 1)
    group = {"name": "night", "kind": "static", "members": ["night-000"]}
    bad: dict[str, list[Any]] = {
        "windows[0]": ["nightly"], "windows[1]": ["daily 02:00-04:00", "daily 25:00-26:00"],
        "windows": ["daily 01:00-02:00"] * 17,
    }
    for field, windows in bad.items():
        answer = api.call("POST", "/api/v1/groups", {**group, "windows": windows})
        assert answer.status == 400 and answer.body["error"]["field"] == field, (field, answer.body)
    assert _groups(api) == []
    made = api.call("POST", "/api/v1/groups", {**group, "windows": ["mon-fri 22:00-02:00"]})
    assert made.status == 201 and made.body["windows"] == ["Mon-Fri 22:00-02:00"]
    refused = api.call("PATCH", "/api/v1/groups/night", {"windows": ["Mon 02:00-02:00"]})
    assert refused.status == 400 and refused.body["error"]["field"] == "windows[0]"
    assert "never stays open" in refused.body["error"]["message"]
    assert api.call("GET", "/api/v1/groups/night", token="viewer").body["windows"] == ["Mon-Fri 22:00-02:00"]

    variant = _upload(api, "det", 1)["variant"]
    body = {"packages": [variant], "selector": "group:night", "waves": "100%", "bake": "1s"}
    for deadline, says in (("tomorrow", "is not an ISO 8601 time"), ("2099-01-01T00:00:00", "has no UTC offset"),
                           ("2001-01-01T00:00:00Z", "is in the past")):
        answer = api.call("POST", "/api/v1/rollouts", {**body, "deadline": deadline})
        assert answer.status == 400 and answer.body["error"]["field"] == "deadline" and says in answer.body["error"]["message"]
    early = api.call("POST", "/api/v1/rollouts", {**body, "start_at": "2099-01-02T00:00:00Z", "deadline": "2099-01-01T00:00:00Z"})
    assert early.status == 400 and early.body["error"]["field"] == "deadline"
    assert api.call("GET", "/api/v1/rollouts", token="viewer").body["rollouts"] == []

    cli = api.edgectl("group", "windows", "night", "Mon 99:00-01:00")
    assert cli.returncode == 2 and "windows[0]" in cli.stderr and len(cli.stderr.strip().splitlines()) == 1
    set_by_cli = json.loads(api.edgectl("group", "windows", "night", "daily 02:00-04:00", "--json", check=True).stdout)
    assert set_by_cli["windows"] == ["daily 02:00-04:00"]
    assert "daily 02:00-04:00" in api.edgectl("group", "list", check=True).stdout
    cleared = json.loads(api.edgectl("group", "windows", "night", "--json", check=True).stdout)
    assert cleared["windows"] == []


def test_a_configuration_set_on_a_group_reaches_each_of_its_devices(api: ApiPlane) -> None:
    """PUT /api/v1/groups/{name}/config and `edgectl group config`: each device the group resolves to now gets its
    next version; bad settings are a 400 naming the key and nothing is stored for any device."""
    api.agents(2, prefix="line")
    _online(api, 2)
    line = {"name": "line", "kind": "static", "members": ["line-000", "line-001"]}
    assert api.call("POST", "/api/v1/groups", line).status == 201
    assert api.call("POST", "/api/v1/groups", {"name": "none", "kind": "static"}).status == 201
    bad = api.call("PUT", "/api/v1/groups/line/config", {"settings": {"maintenance_windows": ["weekly"]}})
    assert bad.status == 400 and bad.body["error"]["field"] == "settings.maintenance_windows[0]", bad.body
    assert api.call("GET", "/api/v1/devices/line-000/config", token="viewer").body["desired"] is None
    assert api.call("PUT", "/api/v1/groups/nope/config", {"settings": {}}).status == 404
    empty = api.call("PUT", "/api/v1/groups/none/config", {"settings": {}})
    assert empty.status == 409 and "resolves to no device" in empty.body["error"]["message"]
    assert api.call("PUT", "/api/v1/groups/line/config", {"settings": {}}, token="viewer").status == 403

    done = api.call("PUT", "/api/v1/groups/line/config", {"settings": {"telemetry_interval_s": 30}})
    assert done.status == 200 and done.body == {"group": "line", "devices": [
        {"device_id": "line-000", "version": 1}, {"device_id": "line-001", "version": 1}]}
    by_cli = json.loads(api.edgectl("group", "config", "line", "--window", "Sat 01:00-02:00", "--json", check=True).stdout)
    assert [d["version"] for d in by_cli["devices"]] == [2, 2]
    desired = api.call("GET", "/api/v1/devices/line-001/config", token="viewer").body["desired"]
    assert desired["settings"] == {"maintenance_windows": ["Sat 01:00-02:00"]} and desired["updated_by"].startswith("cli:")
    audit = [e["detail"] for e in api.call("GET", "/api/v1/audit", token="viewer").body["entries"]
             if e["action"] == "device config set"]
    assert sum("(group line)" in d for d in audit) == 4
