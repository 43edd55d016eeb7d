"""Acknowledged means durable: a desired state is saved before its sequence number, queued ones survive a kill,
and a restart never serves a model that was not committed (issue 13.1).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from tests.deploy.controller import Controller, PausableAgent
from tests.deploy.test_rejections import DEPLOY, serves
from tests.fleet import wait_for


def _last_seq(agent: PausableAgent) -> int:
    return int(json.loads((agent.state_dir / "ledger.json").read_text())["last_seq"])


def test_the_sequence_number_is_saved_only_after_the_desired_state(controller: Controller, pausable: Callable[..., PausableAgent],
                                                                   model_v: Callable[..., Path]) -> None:
    """Where the job cannot be saved, the message is not acknowledged, so the same message is taken when it comes again.

    Saving the sequence number first would acknowledge a desired state that no file holds: the
    repeat would then be refused as a replay and the update lost."""
    agent = pausable("s-1", extra={"deploy": DEPLOY})
    assert controller.final("s-1", controller.desired("s-1", controller.package(model_v(1), "m", 1))).status == "ok"
    jobs = agent.state_dir / "jobs.json"
    jobs.unlink(missing_ok=True)
    jobs.mkdir()  # the job queue cannot be written (as on a full disk); the ledger still can
    acknowledged = _last_seq(agent)
    v2 = controller.package(model_v(2), "m", 2)
    seq, since = controller.next_seq(), len(controller.events)
    deployment = controller.desired("s-1", v2, seq=seq)
    event = controller.rejection("s-1", since)
    assert "cannot save the job queue" in event.detail, event
    assert _last_seq(agent) == acknowledged, "the sequence number was saved for a desired state that was not"
    assert agent.alive() and serves(agent, "m", 1)

    jobs.rmdir()
    controller.desired("s-1", v2, seq=seq, deployment_id=deployment)  # the same message again
    assert controller.final("s-1", deployment).status == "ok"
    wait_for(lambda: serves(agent, "m", 2), 30, "v2 served")
    assert _last_seq(agent) == seq


def test_a_desired_state_queued_behind_a_deployment_survives_a_kill(
        controller: Controller, pausable: Callable[..., PausableAgent], model_v: Callable[..., Path]) -> None:
    agent = pausable("q-1", extra={"deploy": DEPLOY})
    assert controller.final("q-1", controller.desired("q-1", controller.package(model_v(1), "m", 1))).status == "ok"
    agent.stop()
    agent.pause_in = "stage"
    agent.start()
    first = controller.desired("q-1", controller.package(model_v(2), "m", 2))
    wait_for(lambda: (agent.state_dir / "paused-in-stage").exists(), 60, "the first deployment paused in stage")
    seq = controller.next_seq()
    queued = controller.desired("q-1", controller.package(model_v(3), "m", 3), seq=seq)
    wait_for(lambda: _last_seq(agent) == seq, 20, "the queued desired state acknowledged")
    agent.kill()  # a power cut: nothing in memory survives
    (agent.state_dir / "paused-in-stage").unlink()
    agent.pause_in = None
    agent.start()
    assert controller.final("q-1", first).status == "ok"  # the interrupted one finishes first
    assert controller.final("q-1", queued).status == "ok"
    wait_for(lambda: serves(agent, "m", 3), 30, "v3 served")
    # The job's record is dropped just after its final event is sent: wait for it, do not race it.
    wait_for(lambda: json.loads((agent.state_dir / "jobs.json").read_text())["jobs"] == [], 30, "the job queue emptied")


def test_after_a_kill_in_health_only_the_committed_model_is_served(controller: Controller, pausable: Callable[..., PausableAgent],
                                                                    model_v: Callable[..., Path]) -> None:
    """The pointer names the new model when HEALTH is saved; the restarted agent puts v1 back before it serves."""
    agent = pausable("h-1", extra={"deploy": DEPLOY})
    assert controller.final("h-1", controller.desired("h-1", controller.package(model_v(1), "m", 1))).status == "ok"
    agent.stop()
    agent.pause_in = "health"
    agent.start()
    deployment = controller.desired("h-1", controller.package(model_v(2), "m", 2))
    wait_for(lambda: (agent.state_dir / "paused-in-health").exists(), 60, "paused in health")
    agent.kill()
    (agent.state_dir / "paused-in-health").unlink()
    assert agent.active_version() == 2  # uncommitted, and what a naive restart would load
    agent.pause_in = None
    agent.start()  # returns once the inference API answers
    served: list[int] = []
    deadline = time.monotonic() + 20
    while not served or (time.monotonic() < deadline
                         and not [e for e in controller.history("h-1", deployment) if e[0] == "done"]):
        version = agent.active_version()  # at least once: the rollback may end before the restart returns
        assert version is not None, "no active model after the restart"
        served.append(version)
        if agent.model_ready("m"):
            served.append(int(agent.http("/v2/models/m")["versions"][0]))
        time.sleep(0.02)
    assert controller.final("h-1", deployment).status == "rolled-back"
    assert set(served) == {1}, f"served or pointed at {sorted(set(served))} after the restart"
    assert serves(agent, "m", 1)
