"""The crash-loop guard's contract with what surrounds it: the exit code a hung run ends the agent with (its
supervisor restarts on it, docs/reliability.md), and the record an older agent saved."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from agent.config import DeploySettings
from agent.deploy.slots import ActiveModel
from agent.guard import EXIT_HUNG, MAX_INSTALLS, CrashLoopGuard, GuardPolicy, Verdict
from edgecore.protocol.messages import MAX_SET_MODELS, MAX_SET_PIPELINES
from tests.checkout import checkout_env

V2 = ActiveModel("b", "m", 2, "2" * 64)

_HUNG_CHILD = """
import sys, time
from pathlib import Path
from agent.deploy.slots import ActiveModel
from agent.guard import CrashLoopGuard, GuardPolicy
guard = CrashLoopGuard(Path(sys.argv[1]), GuardPolicy(run_timeout_s=0.3))
with guard.watch(ActiveModel("b", "m", 2, "2" * 64), "dep-2"):
    time.sleep(60)  # a load stuck in native code
"""


def test_a_run_past_its_deadline_ends_the_process_with_exit_75_and_counts_a_death(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", _HUNG_CHILD, str(tmp_path)], env=checkout_env(), timeout=60,
                          capture_output=True, text=True)
    assert done.returncode == EXIT_HUNG == 75, done.stderr  # EX_TEMPFAIL: the supervisor restarts it
    assert "did not finish in time" in done.stderr
    guard = CrashLoopGuard(tmp_path, GuardPolicy())
    assert guard.deaths(V2.manifest_sha256) == 1 and guard.recover() is None  # counted once, not armed any more
    assert guard.deployment_of(V2.manifest_sha256) == "dep-2"


def test_a_record_saved_by_an_older_agent_is_read(tmp_path: Path) -> None:
    """Schema 1 before ``installs`` existed: an armed run it left is still counted as a death."""
    (tmp_path / "guard.json").write_text(json.dumps({"schema": 1, "armed": {"sha": V2.manifest_sha256, "what": "m v2"},
                                                     "deaths": {V2.manifest_sha256: [1000.0]}}))
    guard = CrashLoopGuard(tmp_path, GuardPolicy(max_deaths=2), clock=lambda: 1500.0)
    assert guard.recover() == V2.manifest_sha256
    assert guard.deaths(V2.manifest_sha256) == 2 and guard.tripped(V2.manifest_sha256)
    assert guard.deployment_of(V2.manifest_sha256) is None
    assert json.loads((tmp_path / "guard.json").read_text())["schema"] == 1


def test_the_guards_defaults_are_the_agents_settings() -> None:
    deploy = DeploySettings()
    assert GuardPolicy() == GuardPolicy(deploy.crash_loop_max_deaths, deploy.crash_loop_window_s, deploy.load_timeout_s)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _deaths(tmp_path: Path, times: list[float], now: float) -> CrashLoopGuard:
    """The default guard after deaths of V2 at ``times``, looked at ``now``."""
    clock = Clock()
    guard = CrashLoopGuard(tmp_path, GuardPolicy(), clock)
    for at in times:
        clock.now = at
        with guard.watch(V2):
            pass
        record = json.loads((tmp_path / "guard.json").read_text())
        record["armed"] = {"sha": V2.manifest_sha256, "what": "m v2"}  # as a run the process died in leaves it
        (tmp_path / "guard.json").write_text(json.dumps(record))
        guard.recover()
    clock.now = now
    return guard


def test_three_deaths_within_the_hour_trip_the_default_guard_counting_the_edge_of_the_window(tmp_path: Path) -> None:
    assert _deaths(tmp_path / "a", [0.0, 1800.0, 3600.0], 3600.0).tripped(V2.manifest_sha256)  # 0.0 is within the hour
    assert not _deaths(tmp_path / "b", [0.0, 1800.0, 3600.0], 3600.5).tripped(V2.manifest_sha256)
    assert not _deaths(tmp_path / "c", [0.0, 1800.0], 1801.0).tripped(V2.manifest_sha256)
    kept = _deaths(tmp_path / "d", [0.0, 3600.0], 3600.0)
    assert json.loads((tmp_path / "d" / "guard.json").read_text())["deaths"][V2.manifest_sha256] == [0.0, 3600.0]
    assert kept.deaths(V2.manifest_sha256) == 2


def test_the_record_keeps_the_deployments_of_both_slots_of_every_name_a_set_may_hold(tmp_path: Path) -> None:
    assert MAX_INSTALLS == 2 * (MAX_SET_MODELS + MAX_SET_PIPELINES) == 160
    guard = CrashLoopGuard(tmp_path, GuardPolicy())
    models = [ActiveModel("a", "m", v, f"{v:064d}") for v in range(1, MAX_INSTALLS + 2)]
    for model in models:
        with guard.watch(model, f"dep-{model.version}"):
            pass
    assert guard.deployment_of(models[0].manifest_sha256) is None  # one past the limit: the oldest is dropped
    assert [guard.deployment_of(m.manifest_sha256) for m in models[1:]] == [f"dep-{m.version}" for m in models[1:]]


def test_a_verdict_says_what_serves_now() -> None:
    v1 = ActiveModel("a", "m", 1, "1" * 64)
    assert Verdict(V2, v1, 3, 3600.0).detail() == (
        "crash loop: m v2 killed or hung the agent 3 times within 3600s; rolled back to m v1")
    assert Verdict(V2, None, 3, 60.0).detail().endswith("within 60s; rolled back to no model")
