"""Operator commands on live rollouts: pause, resume, abort, retry-failed; offline devices; JSON and the audit log."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from edgecore.protocol.ledger import Ledger
from edgectl.controller.reports import desired_seq
from tests.control.conftest import ControlPlane, audit_actions
from tests.deploy.test_rejections import DEPLOY
from tests.fleet import AgentProcess, wait_for


def _command(plane: ControlPlane, action: str, rollout_id: str) -> Any:
    return json.loads(plane.edgectl("rollout", action, rollout_id, "--json", check=True).stdout)


def test_pause_holds_promotion_resume_continues_and_the_audit_log_keeps_every_step(plane: ControlPlane) -> None:
    plane.agents(4)
    plane.start_controller()
    plane.wait_devices(4)
    rid = plane.deploy(str(plane.package("clf", 1)), "--fleet", "all", "--waves", "1,100%", "--bake", "4s")
    assert _command(plane, "pause", rid) == {"rollout_id": rid, "requested": "pause"}
    wait_for(lambda: plane.row(rid).status == "paused", 10, "the pause to apply")
    wait_for(lambda: plane.row(rid).phase == "baking", 30, "wave 1 to install while paused")
    bake_ends = plane.row(rid).phase_since + 4
    wait_for(lambda: time.time() > bake_ends + 1, 10, "wave 1's bake time to pass")
    assert plane.row(rid).wave == 1, "a paused rollout promoted a wave"
    assert sorted(d.status for d in plane.devices(rid).values()) == ["ok", "planned", "planned", "planned"]
    refused = plane.edgectl("rollout", "resume", "r-none")
    assert refused.returncode == 2 and "no rollout 'r-none'" in refused.stderr

    _command(plane, "resume", rid)
    summary = plane.ended(rid)
    assert summary["status"] == "done" and all(d["status"] == "ok" for d in summary["devices"]), summary
    refused = plane.edgectl("rollout", "pause", rid)
    assert refused.returncode == 2 and f"cannot pause rollout {rid}: it is done" in refused.stderr

    actions = audit_actions(summary)
    for step in ("rollout created", "pause requested", "pause", "resume requested", "resume", "wave started",
                 "wave installed", "wave promoted", "rollout done"):
        assert step in actions, (step, actions)
    for device in ("sim-000", "sim-003"):
        assert audit_actions(summary, device) == ["device sent", "device running", "device ok"], audit_actions(summary, device)
    log = json.loads(plane.edgectl("rollout", "log", rid, "--json", check=True).stdout)
    assert [e["action"] for e in log] == actions
    listed = json.loads(plane.edgectl("rollout", "list", "--json", check=True).stdout)
    assert [(r["id"], r["status"], r["device_counts"]) for r in listed] == [(rid, "done", {"ok": 4})]


def test_abort_rolls_back_devices_that_took_it_and_an_offline_device_never_gets_it(plane: ControlPlane) -> None:
    plane.configure({"deploy": {"timeout_s": 10}})
    agents = plane.agents(4)
    plane.start_controller()
    plane.fleet.stop("sim-003")
    plane.wait_devices(4, online=3)
    rid = plane.deploy(str(plane.package("clf", 1)), "--fleet", "all", "--waves", "100%", "--bake", "60s")
    wait_for(lambda: sorted(d.status for d in plane.devices(rid).values()) == ["deferred", "ok", "ok", "ok"], 30,
             "3 installed, 1 deferred")
    _command(plane, "abort", rid)

    summary = plane.ended(rid)
    assert summary["status"] == "aborted" and summary["reason"] == "aborted by operator", summary
    assert {d["device_id"]: d["status"] for d in summary["devices"]} == {
        "sim-000": "rolled-back", "sim-001": "rolled-back", "sim-002": "rolled-back", "sim-003": "cancelled"}
    assert plane.versions() == {"sim-000": None, "sim-001": None, "sim-002": None}
    assert "rollout aborted" in audit_actions(summary)

    withdrawn = plane.devices(rid)["sim-003"].desired
    assert withdrawn is not None
    back = plane.restart_agent(agents[3])
    wait_for(lambda: Ledger(back.state_dir).last_seq >= desired_seq(withdrawn), 20, "sim-003 to read its withdrawn desired state")
    assert back.active is None and plane.devices(rid)["sim-003"].status == "cancelled"


def test_offline_device_catches_up_when_it_returns_after_the_rollout(plane: ControlPlane) -> None:
    agents = plane.agents(3)
    plane.start_controller()
    plane.fleet.stop("sim-002")
    plane.wait_devices(3, online=2)
    rid = plane.deploy(str(plane.package("clf", 1)), "--fleet", "all", "--waves", "100%", "--bake", "1s")
    summary = plane.ended(rid)
    assert summary["status"] == "done"
    assert {d["device_id"]: d["status"] for d in summary["devices"]} == {"sim-000": "ok", "sim-001": "ok", "sim-002": "deferred"}

    back = plane.restart_agent(agents[2])
    wait_for(lambda: plane.devices(rid)["sim-002"].status == "ok", 30, "sim-002 to catch up")
    assert back.active is not None and back.active.version == 1
    assert audit_actions(plane.rollout(rid), "sim-002") == ["device deferred", "device running", "device ok"]
    shown = json.loads(plane.edgectl("device", "show", "sim-002", "--json", check=True).stdout)
    assert (shown["model"], shown["version"]) == ("clf", 1) and [a["action"] for a in shown["audit"]][-1] == "device ok"


def test_retry_failed_sends_again_to_a_device_that_failed(plane: ControlPlane, agents: Callable[..., AgentProcess]) -> None:
    plane.agents(2)
    full_disk = {"deploy": {**DEPLOY, "download_quota_bytes": 1000}}
    real = agents(plane.home, "real-1", target="cpu-x86", extra=full_disk)
    plane.start_controller()
    plane.wait_devices(3)
    rid = plane.deploy(str(plane.package("clf", 1)), "--fleet", "all", "--waves", "100%", "--bake", "1s", "--max-failure", "50%")
    summary = plane.ended(rid)
    assert summary["status"] == "done", summary
    failed = {d["device_id"]: d for d in summary["devices"]}["real-1"]
    assert failed["status"] == "failed" and "disk full" in failed["detail"], failed

    real.stop()
    real.extra["deploy"] = DEPLOY  # the disk was cleaned up
    real.start()
    _command(plane, "retry-failed", rid)
    wait_for(lambda: plane.devices(rid)["real-1"].status == "ok", 60, "real-1 to commit on retry")
    summary = plane.ended(rid)
    assert summary["status"] == "done" and all(d["status"] == "ok" for d in summary["devices"]), summary
    assert (real.active() or {}).get("version") == 1
    assert "device retry" not in audit_actions(summary) and audit_actions(summary, "real-1").count("device sent") == 2
