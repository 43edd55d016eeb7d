"""The agent installs only inside its maintenance window, by its own clock and time zone (agent/deploy/window.py).

A real agent and broker: the desired set carries windows that are closed now in the agent's zone
(agent.yaml ``timezone``). The agent says when it will install and installs nothing; the wait
survives a restart; a newer desired set replaces it at once; a passed deadline installs at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

from edgecore.protocol.reports import DeviceEvent
from edgecore.windows import Maintenance, Windows, zone
from tests.deploy.controller import Controller, PausableAgent
from tests.deploy.test_rejections import DEPLOY
from tests.fleet import wait_for

ZONE = "Etc/GMT-9"  # UTC+9, no daylight saving: the expected opening is plain arithmetic


def _closed_now() -> tuple[Windows, float]:
    """A daily window opening six hours from now in ZONE (closed now), and that opening as a Unix time."""
    local = datetime.now(zone(ZONE)).replace(second=0, microsecond=0) + timedelta(hours=6)
    end = local + timedelta(hours=1)
    return Windows.parse([f"daily {local:%H:%M}-{end:%H:%M}"]), local.timestamp()


def _waiting(controller: Controller, deployment_id: str, after: int = 0) -> Callable[[], DeviceEvent | None]:
    def found() -> DeviceEvent | None:
        events = [e for e in list(controller.events) if e.deployment_id == deployment_id and e.state == "window"
                  and e.status == "waiting"]
        return events[after] if len(events) > after else None
    return found


def test_outside_its_window_the_agent_waits_says_until_when_and_keeps_waiting_across_a_restart(
        controller: Controller, pausable: Callable[..., PausableAgent], model_v: Callable[..., Path]) -> None:
    agent = pausable("win-1", extra={"deploy": DEPLOY, "timezone": ZONE})
    package = controller.package(model_v(1), "clf", 1)
    windows, opens = _closed_now()
    deployment = controller.desired_set("win-1", [(package, "d-win-1")], maintenance=Maintenance((windows,)))
    said: DeviceEvent = wait_for(_waiting(controller, "d-win-1"), 60, "the agent to say it waits for its window")
    assert said.data["window_opens_at"] == opens and said.model == "clf"
    assert "device time" in said.detail
    time.sleep(2)
    assert agent.active("clf") is None  # nothing installed outside the window
    assert not [e for e in controller.events if e.deployment_id == deployment and e.state == "done"]

    agent.stop()
    agent.start()  # the job was saved: after a restart the agent waits again, and still installs nothing
    wait_for(_waiting(controller, "d-win-1", after=1), 60, "the restarted agent to wait again")
    assert agent.active("clf") is None

    open_now = Maintenance((Windows.parse(["daily 00:00-24:00"]),))
    controller.desired_set("win-1", [(package, "d-win-2")], maintenance=open_now)  # a newer set replaces the wait
    superseded = controller.final("win-1", "d-win-1")
    assert superseded.status == "failed" and "superseded" in superseded.detail
    assert controller.final("win-1", "d-win-2").status == "ok"
    assert agent.active_version("clf") == 1


def test_a_passed_deadline_installs_whatever_the_window(controller: Controller, pausable: Callable[..., PausableAgent],
                                                        model_v: Callable[..., Path]) -> None:
    agent = pausable("win-2", extra={"deploy": DEPLOY, "timezone": ZONE})
    package = controller.package(model_v(2), "clf", 2)
    windows, _ = _closed_now()
    controller.desired_set("win-2", [(package, "d-forced")], maintenance=Maintenance((windows,), time.time() - 1))
    assert controller.final("win-2", "d-forced").status == "ok"
    assert agent.active_version("clf") == 2
    assert not [e for e in controller.events if e.deployment_id == "d-forced" and e.state == "window"]


def test_windows_that_never_open_together_refuse_the_unit(controller: Controller, pausable: Callable[..., PausableAgent],
                                                          model_v: Callable[..., Path]) -> None:
    agent = pausable("win-3", extra={"deploy": DEPLOY, "timezone": ZONE})
    package = controller.package(model_v(3), "clf", 3)
    never = Maintenance((Windows.parse(["Mon 01:00-02:00"]), Windows.parse(["Tue 01:00-02:00"])))
    controller.desired_set("win-3", [(package, "d-never")], maintenance=never)
    refused: DeviceEvent = wait_for(lambda: next((e for e in list(controller.events) if e.deployment_id == "d-never"
                                                  and e.state == "window" and e.status == "failed"), None),
                                    60, "the agent to refuse windows that never open")
    assert "never open together" in refused.detail
    assert agent.active("clf") is None


def test_the_devices_own_windows_hold_any_update(controller: Controller, pausable: Callable[..., PausableAgent],
                                                 model_v: Callable[..., Path]) -> None:
    """agent.yaml ``maintenance_windows`` (which a device configuration may set): a desired state that says nothing of
    windows waits for them too; its deadline still forces it."""
    windows, opens = _closed_now()
    agent = pausable("win-4", extra={"deploy": DEPLOY, "timezone": ZONE, "maintenance_windows": windows.texts()})
    package = controller.package(model_v(4), "clf", 4)
    controller.desired_set("win-4", [(package, "d-own")])
    said: DeviceEvent = wait_for(_waiting(controller, "d-own"), 60, "the agent to wait for its own window")
    assert said.data["window_opens_at"] == opens and agent.active("clf") is None
    controller.desired_set("win-4", [(package, "d-own-forced")], maintenance=Maintenance((), time.time() - 1))
    assert controller.final("win-4", "d-own-forced").status == "ok"


def test_a_model_waiting_for_its_window_holds_back_no_other_model_of_the_set(
        controller: Controller, pausable: Callable[..., PausableAgent], model_v: Callable[..., Path]) -> None:
    """Two rollouts' entries in one set: clf's group has a window closed now, det's rollout none. det installs at once;
    clf (first in the plan's order) waits for its window."""
    agent = pausable("win-5", extra={"deploy": DEPLOY, "timezone": ZONE})
    clf, det = controller.package(model_v(5), "clf", 5), controller.package(model_v(6), "det", 6)
    windows, opens = _closed_now()
    controller.desired_set("win-5", [(clf, "d-held"), (det, "d-free")], maintenance={"clf": Maintenance((windows,))})
    assert controller.final("win-5", "d-free").status == "ok"
    said: DeviceEvent = wait_for(_waiting(controller, "d-held"), 60, "clf to wait for its window")
    assert said.data["window_opens_at"] == opens
    assert agent.active_version("det") == 6 and agent.active("clf") is None
