"""First runs under limits and the crash-loop guard, on real agents and a real Mosquitto.

* A package without golden data whose model allocates ~20 GiB, or never returns, on its first run
  fails in STAGE (a limited child); the agent keeps serving the old model.
* A committed model that hangs the agent every time it is loaded (its measurement outlasts
  ``load_timeout_s``) makes the agent end itself; after ``crash_loop_max_deaths`` such deaths the
  restarted agent rolls back to the previous model instead of loading it again, and reports it.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.guard import EXIT_HUNG
from tests.deploy.controller import Controller
from tests.deploy.test_rejections import DEPLOY, serves
from tests.fleet import AgentProcess, EdgectlHome, wait_for
from tests.packages.hostile import endless_model, huge_allocation_model, slow_model

FIRST_RUN = {**DEPLOY, "stage_timeout_s": 15, "stage_memory_mb": 2048}


@pytest.mark.parametrize("hostile", ["allocates 20 GiB", "never returns"])
def test_a_hostile_first_run_without_golden_data_fails_in_stage(
    tmp_path: Path, home: EdgectlHome, controller: Controller, agents: Callable[..., AgentProcess],
    model_v: Callable[..., Path], hostile: str,
) -> None:
    agent = agents(home, "f-1", extra={"deploy": FIRST_RUN})
    first = controller.final("f-1", controller.desired("f-1", controller.package(model_v(1), "m", 1)))
    assert first.status == "ok", first.detail
    make = huge_allocation_model if hostile.startswith("allocates") else endless_model
    package = controller.package(make(tmp_path / "hostile.onnx"), "m", 2, golden_samples=0)  # nothing to compare with
    deployment = controller.desired("f-1", package)
    final = controller.final("f-1", deployment, timeout=90)
    states = [s for s, _ in controller.history("f-1", deployment)]
    assert final.status == "failed" and "stage" in final.detail, final.detail
    assert "activate" not in states, states  # never ran in the agent's own process
    assert agent.alive() and serves(agent, "m", 1)


def test_a_model_that_hangs_the_agent_k_times_is_rolled_back(
    tmp_path: Path, home: EdgectlHome, controller: Controller, agents: Callable[..., AgentProcess],
    model_v: Callable[..., Path],
) -> None:
    agent = agents(home, "g-1", extra={"deploy": DEPLOY})
    first = controller.final("g-1", controller.desired("g-1", controller.package(model_v(1), "m", 1)))
    assert first.status == "ok", first.detail
    deployment = controller.desired("g-1", controller.package(slow_model(tmp_path / "slow.onnx"), "m", 2))
    second = controller.final("g-1", deployment, timeout=120)
    assert second.status == "ok", second.detail  # measured once, committed, cached
    agent.stop()
    # The selection cache is gone (as after a runtime upgrade): each start measures v2 again, and now a load may
    # take 1.5 s: every start hangs on v2 past its deadline. (Gone before each start: a start whose measurement ended
    # just inside the deadline caches it, and the next start, loading from the cache, would not hang.)
    agent.extra = {"deploy": {**DEPLOY, "load_timeout_s": 1.5, "crash_loop_max_deaths": 2}}
    for death in (1, 2):
        shutil.rmtree(agent.state_dir / "selection", ignore_errors=True)
        with contextlib.suppress(AssertionError):  # on a busy machine it may end itself before its API answers
            agent.start()
        wait_for(lambda: not agent.alive(), 60, f"the agent to end itself on hang {death}")
        assert agent.stop() == EXIT_HUNG, agent.log_text()[-2000:]
    # v1 is measured again too (its cache went with v2's), in a child process: that takes longer than 1.5 s.
    agent.extra = {"deploy": {**DEPLOY, "crash_loop_max_deaths": 2}}
    agent.start()
    wait_for(lambda: serves(agent, "m", 1), 60, "v1 served again after the crash loop")

    def reported() -> bool:
        return any(e.device_id == "g-1" and e.state == "rollback" and e.status == "rolled-back"
                   and "crash loop" in e.detail for e in list(controller.events))

    wait_for(reported, 30, "the crash-loop rollback event")
    # reported under the deployment that installed v2, so that its rollout can link the rollback
    assert [e.deployment_id for e in list(controller.events) if "crash loop" in e.detail] == [deployment]
    assert agent.alive() and agent.active_version() == 1
