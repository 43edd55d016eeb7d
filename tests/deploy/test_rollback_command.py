"""The signed ``rollback`` command: one naming a deployment acts only while that deployment's model is active."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from edgecore.protocol import topics
from edgecore.protocol.envelope import COMMAND_TYPE, sign
from edgecore.protocol.messages import Command
from tests.deploy.controller import Controller
from tests.deploy.test_rejections import DEPLOY, serves
from tests.fleet import AgentProcess, EdgectlHome, wait_for


def _rollback(controller: Controller, device_id: str, deployment_id: str) -> None:
    now = time.time()
    command = Command(device_id, controller.next_seq(), now, now + 3600, "rollback", {"deployment_id": deployment_id})
    envelope = sign(COMMAND_TYPE, command.to_payload(), controller.ring.signing_key("controller"))
    controller.publish(topics.device(device_id, "commands"), envelope.to_bytes())


def test_repeated_rollback_goes_back_one_model_only(home: EdgectlHome, controller: Controller,
                                                    agents: Callable[..., AgentProcess], model_v: Callable[..., Path]) -> None:
    agent = agents(home, "r-1", extra={"deploy": DEPLOY})
    assert controller.final("r-1", controller.desired("r-1", controller.package(model_v(1), "m", 1))).status == "ok"
    second = controller.desired("r-1", controller.package(model_v(2), "m", 2))
    assert controller.final("r-1", second).status == "ok"

    since = len(controller.events)
    _rollback(controller, "r-1", second)
    wait_for(lambda: serves(agent, "m", 1), 30, "v1 served after the rollback")
    # The model is swapped before the event goes out: take the first answer before sending again.
    wait_for(lambda: any(e.state == "rollback" for e in list(controller.events)[since:]), 20, "the first answer")
    since = len(controller.events)
    _rollback(controller, "r-1", second)  # again, e.g. re-sent after a reconnect: nothing more to undo
    event = wait_for(lambda: next((e for e in list(controller.events)[since:] if e.state == "rollback"), None), 20,
                     "the second answer")
    assert event.status == "ok" and event.detail.startswith("nothing to roll back"), event
    assert serves(agent, "m", 1)


def test_a_rollback_sent_during_a_deployment_runs_after_it(home: EdgectlHome, controller: Controller,
                                                           agents: Callable[..., AgentProcess],
                                                           model_v: Callable[..., Path]) -> None:
    """Model changes run on one worker in order: the rollback waits for the deployment ahead of it (issue 13.9)."""
    agent = agents(home, "r-2", extra={"deploy": {**DEPLOY, "download_deadline_s": 60}})
    assert controller.final("r-2", controller.desired("r-2", controller.package(model_v(1), "m", 1))).status == "ok"
    controller.serving = False  # v2's download waits for chunks
    second = controller.desired("r-2", controller.package(model_v(2), "m", 2))
    wait_for(lambda: controller.requests, 20, "v2's chunk request")
    _rollback(controller, "r-2", "")
    time.sleep(1.0)  # the command is acknowledged and queued; nothing may have moved yet
    assert ("rollback", "rolled-back") not in [(e.state, e.status) for e in controller.events if e.device_id == "r-2"]
    assert serves(agent, "m", 1)
    controller.serving = True
    since = len(controller.events)
    controller.requests.clear()
    assert controller.final("r-2", second, timeout=60).status == "ok"
    event = wait_for(lambda: next((e for e in list(controller.events)[since:] if e.state == "rollback"), None), 30,
                     "the rollback after the deployment")
    assert event.status == "rolled-back", event
    wait_for(lambda: serves(agent, "m", 1), 30, "v1 served again: the rollback undid v2, not v1")
