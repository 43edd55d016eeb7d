"""The crash-loop guard on its own: real processes killed while armed, real files, an injected clock."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from agent.deploy.slots import ActiveModel, Slots
from agent.guard import MAX_INSTALLS, CrashLoopGuard, GuardPolicy
from tests.checkout import checkout_env
from tests.fleet import wait_for

V1 = ActiveModel("m/a", "m", 1, "1" * 64)
V2 = ActiveModel("m/b", "m", 2, "2" * 64)
OTHER = ActiveModel("other/a", "other", 5, "5" * 64)

_ARMED_CHILD = """
import sys, time
from pathlib import Path
from agent.deploy.slots import ActiveModel
from agent.guard import CrashLoopGuard, GuardPolicy
guard = CrashLoopGuard(Path(sys.argv[1]), GuardPolicy())
with guard.watch(ActiveModel("m/b", "m", 2, "2" * 64)):
    print("armed", flush=True)
    time.sleep(60)
"""


def _die_while_armed(state: Path) -> None:
    """A real process arms the guard for V2 and is SIGKILLed in the middle of its run."""
    child = subprocess.Popen([sys.executable, "-c", _ARMED_CHILD, str(state)], stdout=subprocess.PIPE, text=True,
                             env=checkout_env())
    assert child.stdout is not None and child.stdout.readline().strip() == "armed"
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=10)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_k_deaths_while_armed_roll_the_model_back_and_no_other(tmp_path: Path) -> None:
    slots = Slots(tmp_path)
    slots.activate(V1, OTHER)
    slots.activate(V2)
    clock = Clock()
    guard = CrashLoopGuard(tmp_path, GuardPolicy(max_deaths=3, window_s=600), clock)
    for death in (1, 2, 3):
        assert guard.admit(slots) == [], f"rolled back after {death - 1} deaths"
        _die_while_armed(tmp_path)
        clock.now += 10
    [verdict] = guard.admit(slots)
    assert verdict.rolled_back == V2 and verdict.active == V1 and verdict.deaths == 3
    assert "killed or hung the agent 3 times" in verdict.detail()
    assert slots.active("m") == V1
    assert slots.active("other") == OTHER  # the model that did not kill the agent stays


def test_deaths_outside_the_window_do_not_count(tmp_path: Path) -> None:
    slots = Slots(tmp_path)
    slots.activate(V1)
    slots.activate(V2)
    clock = Clock()
    guard = CrashLoopGuard(tmp_path, GuardPolicy(max_deaths=2, window_s=600), clock)
    for _ in range(4):  # one death every 700 s: never two within 600 s
        _die_while_armed(tmp_path)
        assert guard.admit(slots) == []
        clock.now += 700
    assert slots.active("m") == V2


def test_a_clean_stop_while_armed_is_not_a_death(tmp_path: Path) -> None:
    guard = CrashLoopGuard(tmp_path, GuardPolicy(max_deaths=1))
    release = threading.Event()

    def load() -> None:
        with guard.watch(V2):
            release.wait(10)

    loader = threading.Thread(target=load)
    loader.start()
    record = tmp_path / "guard.json"
    wait_for(lambda: record.exists() and '"sha"' in record.read_text(), 10, "the guard to arm")
    guard.stand_down()  # what the agent does on SIGTERM
    assert guard.recover() is None and guard.deaths(V2.manifest_sha256) == 0
    release.set()
    loader.join()


def test_a_run_past_its_deadline_counts_as_a_death(tmp_path: Path) -> None:
    hung: list[str] = []
    guard = CrashLoopGuard(tmp_path, GuardPolicy(max_deaths=1, run_timeout_s=0.2), on_hang=hung.append)
    with guard.watch(V2):
        wait_for(lambda: hung, 10, "the hang to be noticed")
    assert hung == ["running m v2"] and guard.tripped(V2.manifest_sha256)
    with guard.watch(V1):
        time.sleep(0.05)  # a run that ends in time is not
    assert guard.deaths(V1.manifest_sha256) == 0


def test_the_rollback_names_the_deployment_that_installed_the_model(tmp_path: Path) -> None:
    """ACTIVATE's run names its deployment; later runs (after restarts, in other processes) find it in the record."""
    slots = Slots(tmp_path)
    slots.activate(V1)
    slots.activate(V2)
    clock = Clock()
    guard = CrashLoopGuard(tmp_path, GuardPolicy(max_deaths=2, window_s=600), clock)
    with guard.watch(V2, "rollout-42"):
        pass  # ACTIVATE's load: it survived, the model was committed
    _die_while_armed(tmp_path)  # later loads of V2 (after restarts) know no deployment id themselves
    assert guard.admit(slots) == []
    clock.now += 10
    _die_while_armed(tmp_path)
    [verdict] = guard.admit(slots)
    assert verdict.rolled_back == V2 and verdict.deployment_id == "rollout-42"


def test_the_record_keeps_the_deployments_of_the_last_few_models_only(tmp_path: Path) -> None:
    guard = CrashLoopGuard(tmp_path, GuardPolicy())
    models = [ActiveModel("m/a", "m", v, f"{v:064d}") for v in range(1, MAX_INSTALLS + 3)]
    for model in models:
        with guard.watch(model, f"d-{model.version}"):
            pass
    with guard.watch(models[0]):  # a run that names no deployment adds nothing
        pass
    assert guard.deployment_of(models[0].manifest_sha256) is None
    assert guard.deployment_of(models[-1].manifest_sha256) == f"d-{models[-1].version}"
    assert len(json.loads((tmp_path / "guard.json").read_text())["installs"]) == MAX_INSTALLS
