"""SIGKILL the agent in every update state, restart it: exactly one valid model serves, history is right.

Table-driven, as Mender's state tests: the state to die in, the model to install, and what must
hold afterwards. The agent pauses in the state after saving it (the hidden test hook), the test
kills it there, then restarts it without the hook.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.deploy.controller import Controller, PausableAgent
from tests.deploy.models import nan_model
from tests.deploy.test_rejections import DEPLOY, serves
from tests.fleet import wait_for

GOOD_PATH = ["download", "verify", "stage", "shadow", "activate", "health", "commit", "done"]

# (state to die in, v2 is a NaN model, version served afterwards, outcome, states reported after the restart)
KILLS = [
    ("download", False, 2, "ok", GOOD_PATH),
    ("verify", False, 2, "ok", GOOD_PATH[1:]),
    ("stage", False, 2, "ok", GOOD_PATH[2:]),
    ("shadow", False, 2, "ok", GOOD_PATH[3:]),
    ("activate", False, 1, "rolled-back", ["rollback", "done"]),
    ("health", False, 1, "rolled-back", ["rollback", "done"]),
    ("commit", False, 2, "ok", ["commit", "done"]),
    ("rollback", True, 1, "rolled-back", ["rollback", "done"]),
]


@pytest.mark.parametrize("state, nan, version, outcome, after", KILLS, ids=[k[0] for k in KILLS])
def test_kill_in_state(state: str, nan: bool, version: int, outcome: str, after: list[str], tmp_path: Path,
                       controller: Controller, pausable: Callable[..., PausableAgent],
                       model_v: Callable[..., Path]) -> None:
    agent = pausable("k-1", extra={"deploy": DEPLOY})
    v1 = controller.package(model_v(1), "m", 1)
    assert controller.final("k-1", controller.desired("k-1", v1)).status == "ok"
    agent.stop()
    agent.pause_in = state
    agent.start()
    model = nan_model(tmp_path / "nan.onnx") if nan else model_v(2)
    v2 = controller.package(model, "m", 2, golden_samples=0 if nan else 1)
    deployment = controller.desired("k-1", v2, shadow={"min_agreement": 0.0})  # SHADOW does real work, never blocks
    wait_for(lambda: (agent.state_dir / f"paused-in-{state}").exists(), 60, f"agent paused in {state}")
    before = wait_for(lambda: (h := [s for s, _ in controller.history("k-1", deployment)]) and h[-1] == state and h,
                      10, f"the {state} event")
    agent.kill()
    (agent.state_dir / f"paused-in-{state}").unlink()
    agent.pause_in = None
    agent.start()

    final = controller.final("k-1", deployment)
    assert final.status == outcome, final.detail
    wait_for(lambda: serves(agent, "m", version), 30, f"v{version} served")
    history = [s for s, _ in controller.history("k-1", deployment)]
    died_in = [*GOOD_PATH[:6], "rollback"] if nan else GOOD_PATH[:GOOD_PATH.index(state) + 1]
    assert history[:len(before)] == before == died_in
    assert history[len(before):] == after, history
