"""Devices, packages and rollouts through the API, against a real controller, Mosquitto and light agents."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from edgecore.protocol.manifest import TargetInfo
from edgectl.examples import tiny_classifier
from edgectl.keys import Keyring
from edgectl.package import BuildOptions, build_package
from tests.api.conftest import ENGINES, Answer, ApiPlane
from tests.fleet import wait_for


def _online(api: ApiPlane, count: int) -> None:
    wait_for(lambda: api.call("GET", "/api/v1/devices?status=online", token="viewer").body["total"] == count, 60,
             f"{count} devices online in the API")


def _upload(api: ApiPlane, name: str, version: int) -> dict[str, Any]:
    answer = api.call("POST", "/api/v1/packages", raw=api.package(name, version).read_bytes())
    assert answer.status == 201, answer.body
    body: dict[str, Any] = answer.body
    return body


def _ended(api: ApiPlane, rollout_id: str, timeout: float = 120) -> dict[str, Any]:
    def final() -> dict[str, Any] | None:
        status: dict[str, Any] = api.call("GET", f"/api/v1/rollouts/{rollout_id}", token="viewer").body
        return status if status["status"] in ("done", "aborted", "rolled-back") else None
    ended: dict[str, Any] = wait_for(final, timeout, f"rollout {rollout_id} to end")
    return ended


def _history(api: ApiPlane, device_id: str, wanted: Any, what: str) -> list[dict[str, Any]]:
    """The device's telemetry history once ``wanted(points)`` holds (ingest keeps a point per device every 5 s)."""
    def points() -> list[dict[str, Any]] | None:
        history: list[dict[str, Any]] = api.call("GET", f"/api/v1/devices/{device_id}", token="viewer").body["telemetry_history"]
        return history if wanted(history) else None
    found: list[dict[str, Any]] = wait_for(points, 90, what)
    return found


@pytest.mark.parametrize("api", ENGINES, indirect=True)
def test_devices_filters_paging_and_detail(api: ApiPlane) -> None:
    api.agents(3, "cpu-x86", prefix="lobby", tags={"group": "lobby"})
    api.agents(2, "jetson-orin", prefix="dock", tags={"group": "dock"})
    _online(api, 5)

    def get(query: str) -> Answer:
        return api.call("GET", f"/api/v1/devices{query}", token="viewer")

    page = get("?limit=2&offset=1").body
    assert page["total"] == 5 and [d["device_id"] for d in page["devices"]] == ["dock-001", "lobby-000"]
    assert get("?target=jetson-orin").body["total"] == 2
    assert get("?tag=group=lobby&status=online").body["total"] == 3
    assert get("?selector=group%3Ddock,id%3Ddock-00*").body["total"] == 2
    assert get("?q=lobby-00").body["total"] == 3
    assert get("?q=LOBBY-00").body["total"] == 3  # either case, on either engine
    assert get("?target=jetson*&tag=group=dock").body["total"] == 2
    assert get("?model=none-such").body["total"] == 0
    unknown = get("?selector=colour%3Dred")
    assert unknown.status == 400 and "colour" in unknown.body["error"]["message"]
    bad = get("?tag=novalue")
    assert bad.status == 400 and bad.body["error"]["field"] == "tag"
    assert get("?limit=0").body["error"]["field"] == "limit"
    assert get("?colour=red").body["error"]["field"] == "colour"
    summary = api.call("GET", "/api/v1/fleet/summary", token="viewer").body
    assert summary["total"] == 5 and summary["by_target"] == {"cpu-x86": 3, "jetson-orin": 2}
    detail = api.call("GET", "/api/v1/devices/lobby-000", token="viewer").body
    assert detail["target"] == "cpu-x86" and detail["tags"] == {"group": "lobby"} and "events" in detail
    missing = api.call("GET", "/api/v1/devices/nope", token="viewer")
    assert missing.status == 404 and "nope" in missing.body["error"]["message"]
    # The device page's charts: CPU and memory over time from the light agents' telemetry (no model served yet).
    history = _history(api, "dock-000", lambda h: len(h) >= 2, "two telemetry history points")
    assert all(0 < p["cpu_percent"] < 100 and 0 < p["memory_percent"] < 100 and p["model"] == "" for p in history)
    assert [p["ts"] for p in history] == sorted(p["ts"] for p in history)
    one = api.call("GET", "/api/v1/devices/dock-000?history=1", token="viewer").body["telemetry_history"]
    assert len(one) == 1 and one[0]["ts"] >= history[-1]["ts"]
    assert api.call("GET", "/api/v1/devices/dock-000?history=0", token="viewer").body["telemetry_history"] == []
    assert api.call("GET", "/api/v1/devices/dock-000?history=-1", token="viewer").body["error"]["field"] == "history"


@pytest.mark.parametrize("api", ENGINES, indirect=True)
def test_upload_rollout_to_done_with_waves_gates_and_audit(api: ApiPlane) -> None:
    agents = api.agents(3)
    _online(api, 3)
    package = _upload(api, "det", 1)
    assert [p["variant"] for p in api.call("GET", "/api/v1/packages", token="viewer").body["packages"]] == [package["variant"]]
    body = {"packages": [package["variant"]], "selector": "all", "waves": "1,100%", "bake": "1s",
            "gates": ["p95_latency <= 1.5x"], "allow_no_data": True}
    dry = api.call("POST", "/api/v1/rollouts", {**body, "dry_run": True})
    assert dry.status == 200 and dry.body["rollout_id"] is None and len(dry.body["plan"]["waves"]) == 2
    created = api.call("POST", "/api/v1/rollouts", body)
    assert created.status == 201, created.body
    status = _ended(api, created.body["rollout_id"])
    assert status["status"] == "done", status["reason"]
    assert [(w["wave"], w["devices"], w["ok"], w["state"]) for w in status["progress"]] == [(1, 1, 1, "done"), (2, 2, 2, "done")]
    gates = {g["metric"]: g for g in status["gate_values"]}
    assert gates["p95_latency"]["threshold"] == 1.5 and gates["failure_rate"]["value"] == 0.0 and gates["failure_rate"]["holds"]
    # A first install: no device ran a model before, so no earlier latency exists: no data, promoted only because the
    # rollout said so (without allow_no_data the wave waits; tests/console/test_console.py, the waiting-for-data test).
    assert gates["p95_latency"]["verdict"] == "no data" and status["allow_no_data"] is True
    assert {d["status"] for d in status["devices"]} == {"ok"}
    assert all(a.active and a.active.name == "det" for a in agents)
    audit = api.call("GET", f"/api/v1/audit?rollout_id={created.body['rollout_id']}", token="viewer").body["entries"]
    assert [e["actor"] for e in audit if e["action"] == "rollout created"] == ["api:operator-user"]
    uploads = [e for e in api.call("GET", "/api/v1/audit", token="viewer").body["entries"] if e["action"] == "package uploaded"]
    assert [e["actor"] for e in uploads] == ["api:operator-user"]
    listed = api.call("GET", "/api/v1/rollouts?status=done", token="viewer").body
    assert listed["total"] == 1 and listed["rollouts"][0]["device_counts"] == {"ok": 3}
    # Latency p50/p95 and the inference rate of the model now served, in the device's telemetry history.
    history = _history(api, agents[0].device_id, lambda h: sum(p["model"] == "det" for p in h) >= 2, "two points of det")
    served = [p for p in history if p["model"] == "det"]
    assert all(p["version"] == 1 and 0 < p["p50_ms"] <= p["p95_ms"] for p in served)
    assert served[-1]["rate_rps"] is not None and served[-1]["rate_rps"] > 0


@pytest.mark.parametrize("api", ENGINES, indirect=True)
def test_paced_rollout(api: ApiPlane) -> None:
    """max_per_minute paces each wave, as `edgectl deploy --fleet --max-per-minute`: in the plan and the rollout."""
    api.agents(3)
    _online(api, 3)
    package = _upload(api, "det", 1)
    body = {"packages": [package["variant"]], "selector": "all", "waves": "100%", "bake": "1s", "max_per_minute": 120}
    dry = api.call("POST", "/api/v1/rollouts", {**body, "dry_run": True}).body["plan"]
    assert dry["max_per_minute"] == 120 and dry["waves"][0]["pacing_s"] == 1.0  # (3 - 1) devices x 60/120 s
    created = api.call("POST", "/api/v1/rollouts", body)
    assert created.status == 201, created.body
    status = _ended(api, created.body["rollout_id"])
    assert status["status"] == "done" and status["max_per_minute"] == 120, status


def test_pause_resume_abort_and_conflicts(api: ApiPlane) -> None:
    api.agents(2)
    _online(api, 2)
    package = _upload(api, "det", 1)
    rollout_id = api.call("POST", "/api/v1/rollouts", {"packages": [package["variant"]], "selector": "all",
                                                       "waves": "1,100%", "bake": "10m"}).body["rollout_id"]
    assert api.call("POST", f"/api/v1/rollouts/{rollout_id}/resume").status == 409  # running: nothing to resume
    paused = api.call("POST", f"/api/v1/rollouts/{rollout_id}/pause")
    assert paused.status == 202 and paused.body == {"rollout_id": rollout_id, "requested": "pause"}
    wait_for(lambda: api.call("GET", f"/api/v1/rollouts/{rollout_id}", token="viewer").body["status"] == "paused", 30, "paused")
    assert api.call("POST", f"/api/v1/rollouts/{rollout_id}/resume").status == 202
    wait_for(lambda: api.call("GET", f"/api/v1/rollouts/{rollout_id}", token="viewer").body["status"] == "running", 30,
             "running")
    assert api.call("POST", f"/api/v1/rollouts/{rollout_id}/abort", token="viewer").status == 403
    assert api.call("POST", f"/api/v1/rollouts/{rollout_id}/abort").status == 202
    assert _ended(api, rollout_id)["status"] == "aborted"
    assert api.call("POST", f"/api/v1/rollouts/{rollout_id}/pause").status == 409
    assert api.call("POST", "/api/v1/rollouts/r-none/pause").status == 404
    actions = [(e["action"], e["actor"]) for e in
               api.call("GET", f"/api/v1/audit?rollout_id={rollout_id}", token="viewer").body["entries"]]
    assert ("abort requested", "api:operator-user") in actions and ("pause requested", "api:operator-user") in actions


def test_bad_bodies_name_the_field(api: ApiPlane) -> None:
    api.agents(1)
    _online(api, 1)
    variant = _upload(api, "det", 1)["variant"]
    cases = {
        "packages": {"selector": "all"},
        "selector": {"packages": [variant]},
        "packages[0]": {"packages": ["f" * 64], "selector": "all"},
        "waves": {"packages": [variant], "selector": "all", "waves": "half"},
        "bake": {"packages": [variant], "selector": "all", "bake": "soon"},
        "max_failure": {"packages": [variant], "selector": "all", "max_failure": "200%"},
        "gates[1]": {"packages": [variant], "selector": "all", "gates": ["error_rate <= 1%", "speed >= 3"]},
        "shadow": {"packages": [variant], "selector": "all", "shadow": "yes"},
        "max_per_minute": {"packages": [variant], "selector": "all", "max_per_minute": -1},
        "max_per_minute ": {"packages": [variant], "selector": "all", "max_per_minute": 1.5},
        "max_per_minute  ": {"packages": [variant], "selector": "all", "max_per_minute": True},
        "colour": {"packages": [variant], "selector": "all", "colour": "red"},
    }
    for field, body in cases.items():
        answer = api.call("POST", "/api/v1/rollouts", body)
        assert answer.status == 400 and answer.body["error"]["field"] == field.strip(), (field, answer.body)
    not_json = api.call("POST", "/api/v1/rollouts", raw=b"{nope", headers={"Content-Type": "application/json"})
    assert not_json.status == 400 and "JSON" in not_json.body["error"]["message"]
    nobody = api.call("POST", "/api/v1/rollouts", {"packages": [variant], "selector": "id=ghost"})
    assert nobody.status == 400 and nobody.body["error"]["field"] == "selector"


def test_upload_refuses_malformed_tampered_and_untrusted(api: ApiPlane, tmp_path: Path) -> None:
    """The server verifies like a device: a package signed by a key it does not trust is refused (422), and it
    signs nothing of its own."""
    good = api.package("det", 1)
    assert api.call("POST", "/api/v1/packages", raw=b"").body["error"]["status"] == 400
    assert api.call("POST", "/api/v1/packages", raw=b"not a tar at all").status == 400
    tampered = bytearray(good.read_bytes())
    tampered[len(tampered) // 2] ^= 0xFF
    assert api.call("POST", "/api/v1/packages", raw=bytes(tampered)).status in (400, 422)
    stranger, ring = tmp_path / "stranger.edgepkg", Keyring(tmp_path / "stranger-keys")
    ring.init("package")
    build_package(tiny_classifier(tmp_path / "m.onnx"), BuildOptions("det", 1, TargetInfo("any")), ring.signing_key("package"),
                  stranger)
    untrusted = api.call("POST", "/api/v1/packages", raw=stranger.read_bytes())
    assert untrusted.status == 422, untrusted.body
    assert api.call("GET", "/api/v1/packages", token="viewer").body["packages"] == []
