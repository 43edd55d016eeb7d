"""SIGKILL a real agent at random moments during successive deploys, 30 times (issue 13.10).

After each restart the agent serves a committed model (the one it served before, or the new one
once its COMMIT was saved); every desired state it was sent is eventually installed or reported
failed, the acknowledged ones included; and the state directory does not grow (downloads,
temp files and backend-selection decisions of models no longer on the device are removed).
Three models take turns, so a selection cache that kept every model would grow.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.protocol.messages import DeviceEvent
from tests.deploy.controller import Controller, PausableAgent
from tests.deploy.test_rejections import DEPLOY
from tests.fleet import wait_for

KILLS = int(os.environ.get("EDGE_KILL_LOOP_KILLS", "30"))
SEED = int(os.environ.get("EDGE_KILL_LOOP_SEED", str(random.SystemRandom().randrange(1 << 30))))


def _record(state_dir: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads((state_dir / "deployment.json").read_text())
        return data
    except (OSError, ValueError):
        return {}


WARM_UP = 6  # kills before the state directory's size is held to its high mark


def _footprint(state_dir: Path) -> tuple[int, int]:
    """(files, bytes) under the state directory, test markers aside."""
    files = [p for p in state_dir.rglob("*") if p.is_file() and not p.name.startswith("paused-in-")]
    return len(files), sum(p.stat().st_size for p in files)


def _swept(state_dir: Path) -> bool:
    """No download left, no temp file (one being written finishes; a killed writer's is swept at start), and the
    selection cache holds at most the active and the previous model."""
    downloads = state_dir / "downloads"
    leftovers = [p for p in downloads.iterdir()] if downloads.is_dir() else []
    temps = [*state_dir.glob(".*.tmp"), *state_dir.glob("selection/.*.tmp")]
    return not leftovers and not temps and len(list((state_dir / "selection").glob("selection-*.json"))) <= 2


def _answer(controller: Controller, device_id: str, deployment_id: str, timeout: float) -> DeviceEvent:
    """The deployment's terminal event, or the 'already active' answer to a desired state naming the served model."""
    def found() -> DeviceEvent | None:
        return next((e for e in list(controller.events) if e.device_id == device_id and e.deployment_id == deployment_id
                     and (e.state == "done" or "already active" in e.detail)), None)
    event: DeviceEvent = wait_for(found, timeout, f"{device_id} to answer {deployment_id}")
    return event


def _active_is(agent: PausableAgent, version: int) -> Callable[[], bool]:
    return lambda: (active := agent.active()) is not None and active["version"] == version


def test_thirty_kills_during_successive_deploys(controller: Controller, pausable: Callable[..., PausableAgent],
                                                model_v: Callable[..., Path]) -> None:
    rng = random.Random(SEED)
    print(f"kill loop seed {SEED} (EDGE_KILL_LOOP_SEED to repeat)")
    # These kills are not the model's doing: keep the crash-loop guard (agent/guard.py) from rolling back for them.
    deploy = {**DEPLOY, "health_runs": 2, "crash_loop_max_deaths": 10 * KILLS}
    agent = pausable("kl-1", extra={"deploy": deploy, "telemetry_interval_s": 5.0})
    packages = [controller.package(model_v(n), "m", n) for n in (1, 2, 3)]
    assert controller.final("kl-1", controller.desired("kl-1", packages[0])).status == "ok"
    committed = 1
    baseline: tuple[int, int] | None = None
    for kill in range(KILLS):
        package = packages[(kill + 1) % 3]
        deployment = controller.desired("kl-1", package, allow_downgrade=True)
        time.sleep(rng.uniform(0.0, 1.2))  # a deploy takes about a second here: die anywhere in it, or just after
        agent.kill()
        record = _record(agent.state_dir)
        allowed = {committed}
        if record.get("deployment_id") == deployment and (
                record.get("state") == "commit" or (record.get("state") == "done" and record.get("outcome") == "ok")):
            allowed.add(package.manifest.version)  # COMMIT was saved: the new model is the committed one
        agent.start()
        at_restart = agent.active()
        version = at_restart and at_restart["version"]
        assert version in allowed, f"kill {kill}: restarted on v{version}, committed {sorted(allowed)} ({record.get('state')})"

        answer = _answer(controller, "kl-1", deployment, 60)
        if answer.status == "ok":
            committed = package.manifest.version
        else:
            assert answer.status in ("failed", "rolled-back"), answer
        wait_for(_active_is(agent, committed), 30, f"v{committed} active")
        wait_for(lambda: _swept(agent.state_dir), 10, "the worker's sweep after the deployment")
        files, size = _footprint(agent.state_dir)
        if kill < WARM_UP:  # all three models on the device, both slots filled and emptied by failures: the high mark
            baseline = (max(files, baseline[0]), max(size, baseline[1])) if baseline else (files, size)
        else:
            assert baseline is not None
            assert files <= baseline[0] and size <= baseline[1] * 1.5 + 64 * 1024, \
                f"kill {kill}: state directory grew from {baseline} to {(files, size)}: " \
                f"{sorted(str(p.relative_to(agent.state_dir)) for p in agent.state_dir.rglob('*') if p.is_file())}"
    print(f"{KILLS} kills; state directory {baseline} -> {_footprint(agent.state_dir)}")
