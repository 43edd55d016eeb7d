"""SIGKILL a real agent at random moments during successive deploys, 30 times (issue 13.10), with two models.

The device runs two models, ``a`` and ``b``; each desired set (schema 2) moves one of them to its
next version and keeps the other. After each restart the agent serves, for each model, a
committed version (the one it served before, or the new one once its COMMIT was saved), and the
model the set did not change never moves; every desired state it was sent is eventually installed
or reported failed, the acknowledged ones included; and the state directory holds nothing beyond its
structure after each sweep (the state files, each model's two slots, a selection record per model in
a slot: downloads, temp files and backend-selection decisions of versions no longer on the device are
removed, so it is bounded per model). Three versions of each take turns, so a selection cache that kept
every version would grow. The compiled-model cache (``<state>/compiled``) has a limit of its own
(``edgecore.compiled_cache.MAX_BYTES``, and only each model's active and previous version's keys
after a sweep): it is held to that.

The loop's kills land anywhere; one window needs aiming: a power cut between saving a queued job and
saving its sequence number (``test_a_power_cut_between_the_queued_job_and_its_sequence_number``).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgecore.compiled_cache import MAX_BYTES
from edgecore.protocol.reports import DeviceEvent
from tests.deploy.controller import Controller, PausableAgent
from tests.deploy.test_rejections import DEPLOY
from tests.fleet import wait_for

KILLS = int(os.environ.get("EDGE_KILL_LOOP_KILLS", "30"))
SEED = int(os.environ.get("EDGE_KILL_LOOP_SEED", str(random.SystemRandom().randrange(1 << 30))))


MODELS = ("a", "b")


def _record(state_dir: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads((state_dir / "deployment.json").read_text())
        return data
    except (OSError, ValueError):
        return {}


def _record_ids(record: dict[str, Any]) -> set[str]:
    """The deployment ids a saved record is about (its parts')."""
    return {part.get("deployment_id") for part in record.get("parts", [])}


def _activations(record: dict[str, Any]) -> int:
    """How many times the saved deployment entered ACTIVATE (the slot pointer switches there)."""
    return int(record.get("entries", {}).get("activate", 0))


def _footprint(state_dir: Path) -> tuple[int, int]:
    """(files, bytes) under the state directory, test markers and the compiled-model cache (bounded apart) aside."""
    compiled = state_dir / "compiled"
    files = [p for p in state_dir.rglob("*") if p.is_file() and not p.name.startswith("paused-in-")
             and compiled not in p.parents]
    return len(files), sum(p.stat().st_size for p in files)


STATE_FILES = {"deployment.json", "footprints.json", "guard.json", "jobs.json", "ledger.json", "models.json"}
SMALL_FILES_BYTES = 256 * 1024  # the state files and selection records together: small JSON documents


def _stray(state_dir: Path) -> list[str]:
    """What the state directory holds beyond its bound, by structure (a high mark taken over the first kills depended on
    which slots their random outcomes had filled): the state files, each model's two slots, a selection record per model
    in a slot, and those small files within SMALL_FILES_BYTES."""
    slots = [d for d in (state_dir / "models").glob("*/*") if d.is_dir()]
    keys = {hashlib.sha256((d / "model.onnx").read_bytes()).hexdigest()[:16] for d in slots if (d / "model.onnx").is_file()}
    stray, small = [], 0
    for path in state_dir.rglob("*"):
        rel = path.relative_to(state_dir)
        if not path.is_file() or path.name.startswith("paused-in-") or rel.parts[0] == "compiled":
            continue  # test markers; the compiled-model cache is held by _compiled_within_its_limit
        if rel.parts[0] == "models":
            if len(rel.parts) != 4 or rel.parts[1] not in MODELS or rel.parts[2] not in ("a", "b"):
                stray.append(str(rel))
            continue
        small += path.stat().st_size
        selection = rel.parts[0] == "selection" and len(rel.parts) == 2 and rel.name.removeprefix("selection-")[:16] in keys
        if str(rel) not in STATE_FILES and not selection:
            stray.append(str(rel))
    return stray if small <= SMALL_FILES_BYTES else [*stray, f"state files and selections: {small} bytes"]


def _settled_stray(state_dir: Path, within: float = 5.0) -> list[str]:
    """:func:`_stray` once it is empty, or what it still holds after ``within`` seconds. The worker reports a job's end
    before it sweeps (a failed deployment's selection record goes then), and a temp file may be a write in progress
    (the worker saves its queue whenever a message arrives) that finishes by renaming it away; what the sweep leaves,
    or a killed writer's temp file, stays and is reported."""
    deadline = time.monotonic() + within
    while True:
        try:
            stray = _stray(state_dir)
        except FileNotFoundError as exc:  # the sweep removed a directory while it was read
            stray = [f"(read again: {exc.filename} went while it was read)"]
        if not stray or time.monotonic() >= deadline:
            return stray
        time.sleep(0.1)


def _compiled_within_its_limit(state_dir: Path) -> bool:
    """The compiled-model cache within MAX_BYTES and, per runtime and device, the keys of at most two versions of each
    model."""
    compiled = state_dir / "compiled"
    if not compiled.is_dir():
        return True
    size = sum(p.stat().st_size for p in compiled.rglob("*") if p.is_file())
    keys_per_device = [sum(1 for key in device.iterdir() if key.is_dir()) for device in compiled.glob("*/*") if device.is_dir()]
    return size <= MAX_BYTES and all(n <= 2 * len(MODELS) for n in keys_per_device)


def _swept(state_dir: Path) -> bool:
    """No download left, no temp file (one being written finishes; a killed writer's is swept at start), and the
    selection and compiled-model caches hold at most each model's active and previous version."""
    downloads = state_dir / "downloads"
    leftovers = [p for p in downloads.iterdir()] if downloads.is_dir() else []
    temps = [*state_dir.glob(".*.tmp"), *state_dir.glob("selection/.*.tmp")]
    selections = len(list((state_dir / "selection").glob("selection-*.json")))
    return not leftovers and not temps and selections <= 2 * len(MODELS) and _compiled_within_its_limit(state_dir)


def _answer(controller: Controller, device_id: str, deployment_id: str, timeout: float) -> DeviceEvent:
    """The deployment's terminal event, or the 'already active' answer to a desired state naming the served model."""
    def found() -> DeviceEvent | None:
        return next((e for e in list(controller.events) if e.device_id == device_id and e.deployment_id == deployment_id
                     and (e.state == "done" or "already active" in e.detail)), None)
    event: DeviceEvent = wait_for(found, timeout, f"{device_id} to answer {deployment_id}")
    return event


def _active_is(agent: PausableAgent, version: int, name: str | None = None) -> Callable[[], bool]:
    return lambda: (active := agent.active(name)) is not None and active["version"] == version


def _versions(agent: PausableAgent) -> dict[str, int | None]:
    return {name: agent.active_version(name) for name in MODELS}


def test_thirty_kills_during_successive_deploys_of_two_models(controller: Controller,
                                                               pausable: Callable[..., PausableAgent],
                                                               model_v: Callable[..., Path]) -> None:
    rng = random.Random(SEED)
    print(f"kill loop seed {SEED} (EDGE_KILL_LOOP_SEED to repeat)")
    # These kills are not the model's doing: keep the crash-loop guard (agent/guard.py) from rolling back for them.
    deploy = {**DEPLOY, "health_runs": 2, "crash_loop_max_deaths": 10 * KILLS}
    agent = pausable("kl-1", extra={"deploy": deploy, "telemetry_interval_s": 5.0})
    packages = {name: [controller.package(model_v(n + 10 * i), name, n) for n in (1, 2, 3)]
                for i, name in enumerate(MODELS)}
    installed = {name: f"d-{name}-1" for name in MODELS}  # the deployment that installed each committed version
    controller.desired_set("kl-1", [(packages[name][0], installed[name]) for name in MODELS])
    for name in MODELS:
        assert controller.final("kl-1", installed[name]).status == "ok"
    committed = {name: 1 for name in MODELS}
    baseline: tuple[int, int] | None = None
    for kill in range(KILLS):
        name, other = MODELS[kill % 2], MODELS[(kill + 1) % 2]
        version = committed[name] % 3 + 1
        deployment = f"d-{name}-{kill}-{version}"
        controller.desired_set("kl-1", [(packages[n][committed[n] - 1] if n == other else packages[n][version - 1],
                                         installed[n] if n == other else deployment) for n in MODELS],
                               allow_downgrade=True)
        time.sleep(rng.uniform(0.0, 1.2))  # a deploy takes about a second here: die anywhere in it, or just after
        agent.kill()
        record = _record(agent.state_dir)
        allowed = {committed[name]}
        if deployment in _record_ids(record) and (
                record.get("state") == "commit" or (record.get("state") == "done" and record.get("outcome") == "ok")):
            allowed.add(version)  # COMMIT was saved: the new version is the committed one
        agent.start()
        at_restart = _versions(agent)
        resumed = _record(agent.state_dir)  # read after the pointer: a pointer on the new version was switched before it
        before = _activations(record) if deployment in _record_ids(record) else 0
        if deployment in _record_ids(resumed) and _activations(resumed) > before:
            allowed.add(version)  # the restarted agent resumed the deployment and entered ACTIVATE before the read
        assert at_restart[name] in allowed, \
            f"kill {kill}: {name} restarted on v{at_restart[name]}, committed {sorted(allowed)} " \
            f"({record.get('state')} at the kill, {resumed.get('state')} after the restart)"
        assert at_restart[other] == committed[other], f"kill {kill}: {other}, which no set changed, moved: {at_restart}"

        answer = _answer(controller, "kl-1", deployment, 60)
        if answer.status == "ok":
            committed[name], installed[name] = version, deployment
        else:
            assert answer.status in ("failed", "rolled-back"), answer
        for n in MODELS:
            wait_for(_active_is(agent, committed[n], n), 30, f"{n} v{committed[n]} active")
        wait_for(lambda: _swept(agent.state_dir), 10, "the worker's sweep after the deployment")
        stray = _settled_stray(agent.state_dir)
        assert not stray, f"kill {kill}: the state directory holds what no model on the device needs: {stray}"
        files, size = _footprint(agent.state_dir)
        baseline = (max(files, baseline[0]), max(size, baseline[1])) if baseline else (files, size)
    print(f"{KILLS} kills; state directory at most {baseline}, now {_footprint(agent.state_dir)}")


def _ledger(state_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((state_dir / "ledger.json").read_text())
    return data


def test_a_power_cut_between_the_queued_job_and_its_sequence_number(controller: Controller,
                                                                    pausable: Callable[..., PausableAgent],
                                                                    model_v: Callable[..., Path]) -> None:
    """The job of a desired state is saved, then its sequence number: cut the power between the two writes.

    The agent is held in STAGE of deployment A, so deployment B waits queued; B's job and sequence are saved,
    the agent is killed and ledger.json is put back as it was before B (the state a power cut between the two
    writes leaves: each write is atomic). On restart the broker hands B's retained desired state back. B must
    run once: one terminal event, not "superseded by" itself followed by a second run under the same id."""
    agent = pausable("kl-seq", pause_in="stage", extra={"deploy": DEPLOY})
    first, second = (controller.package(model_v(n), "m", n) for n in (1, 2))
    deployment_a = controller.desired("kl-seq", first)
    wait_for(lambda: (agent.state_dir / "paused-in-stage").exists(), 60, "A held in stage")
    before_b = (agent.state_dir / "ledger.json").read_text()
    deployment_b = controller.desired("kl-seq", second)
    seq_b = json.loads(before_b)["last_seq"] + 1  # the controller's counter: B's number is the next one

    def b_saved() -> bool:
        jobs = json.loads((agent.state_dir / "jobs.json").read_text())
        return any(j["deployment_id"] == deployment_b for j in jobs["jobs"]) and _ledger(agent.state_dir)["last_seq"] >= seq_b
    wait_for(b_saved, 30, "B's job and sequence number saved")
    agent.kill()
    (agent.state_dir / "ledger.json").write_text(before_b)  # the ledger write never reached the disk
    agent.pause_in = None
    (agent.state_dir / "paused-in-stage").unlink(missing_ok=True)
    agent.start()

    assert controller.final("kl-seq", deployment_b, 120).status == "ok"
    assert controller.final("kl-seq", deployment_a, 60).status in ("ok", "failed", "rolled-back")
    time.sleep(3)  # room for a second run of B to show itself
    terminal = [e for e in list(controller.events) if e.deployment_id == deployment_b and e.state == "done"]
    assert len(terminal) == 1, [(e.status, e.detail) for e in terminal]
    assert not [e for e in list(controller.events) if f"superseded by deployment {deployment_b}" in e.detail
                and e.deployment_id == deployment_b]
    wait_for(_active_is(agent, 2), 30, "v2 active")
