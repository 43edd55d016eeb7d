"""A full disk at any state (issue 13.3): the deployment fails with a clear event, leftovers go, the worker lives,
and the next desired state deploys once there is room again.

The state directory is a real 4 MiB tmpfs filled to the last page, so every write the agent makes
(records, ledger, job queue, chunks, unpacking, slot pointer) meets the kernel's ENOSPC. (The
download-quota setting is a seam for the download alone; this covers every state.)
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from tests.deploy.conftest import fill
from tests.deploy.controller import Controller, PausableAgent
from tests.deploy.test_rejections import DEPLOY, serves
from tests.fleet import wait_for

# States to fill the disk in (just before the state runs). STAGE and HEALTH write nothing
# themselves: there the next state's record cannot be saved, which must fail the same way.
STATES = ["download", "verify", "stage", "activate", "commit"]


def _leftovers(state_dir: Path) -> list[str]:
    """Downloads and temp files in the state directory; read while the agent's sweep may remove directories."""
    downloads = state_dir / "downloads"
    try:
        found = [p.name for p in downloads.iterdir()] if downloads.is_dir() else []
        return found + [str(p.relative_to(state_dir)) for p in state_dir.rglob(".*.tmp")]
    except FileNotFoundError as exc:  # a directory went while it was read: look again
        return [f"(read again: {exc.filename} went while it was read)"]


def _serves(agent: PausableAgent, version: int) -> Callable[[], bool]:
    return lambda: serves(agent, "m", version)


def test_a_desired_state_on_a_full_disk_is_refused_and_taken_again_later(
        tmp_path: Path, controller: Controller, pausable: Callable[..., PausableAgent],
        model_v: Callable[..., Path], small_disks: Callable[[Path], Path]) -> None:
    disk = small_disks(tmp_path / "fd-1" / "state")
    agent = pausable("fd-1", extra={"deploy": DEPLOY})
    assert controller.final("fd-1", controller.desired("fd-1", controller.package(model_v(1), "m", 1))).status == "ok"
    v2 = controller.package(model_v(2), "m", 2)
    filler = fill(disk)
    seq, since = controller.next_seq(), len(controller.events)
    deployment = controller.desired("fd-1", v2, seq=seq)
    event = controller.rejection("fd-1", since)
    assert "No space left on device" in event.detail, event
    assert agent.alive() and serves(agent, "m", 1)
    filler.unlink()
    controller.desired("fd-1", v2, seq=seq, deployment_id=deployment)  # as a reconnect hands the retained one back
    assert controller.final("fd-1", deployment).status == "ok"
    wait_for(lambda: serves(agent, "m", 2), 30, "v2 served")


def test_a_disk_filling_up_in_any_state(tmp_path: Path, controller: Controller, pausable: Callable[..., PausableAgent],
                                        model_v: Callable[..., Path], small_disks: Callable[[Path], Path]) -> None:
    disk = small_disks(tmp_path / "fd-2" / "state")
    agent = pausable("fd-2", extra={"deploy": DEPLOY})
    assert controller.final("fd-2", controller.desired("fd-2", controller.package(model_v(1), "m", 1))).status == "ok"
    version = 1
    for n, state in enumerate(STATES):
        agent.stop()
        agent.pause_in = state
        agent.start()
        marker = disk / f"paused-in-{state}"
        doomed = controller.desired("fd-2", controller.package(model_v(10 + n), "m", version + 1))
        wait_for(marker.exists, 60, f"paused in {state}")
        filler = fill(disk)
        marker.unlink()  # go on, on a full disk
        final = controller.final("fd-2", doomed)
        assert final.status in ("failed", "rolled-back"), (state, final)
        assert re.search(r"disk space|No space left", final.detail), (state, final.detail)
        wait_for(lambda: not _leftovers(disk), 10, f"leftovers removed after {state}: {_leftovers(disk)}")
        assert agent.alive() and serves(agent, "m", version), f"v{version} no longer served after {state}"

        filler.unlink()  # room again: the same worker deploys the next desired state
        version += 1
        good = controller.desired("fd-2", controller.package(model_v(20 + n), "m", version))
        wait_for(marker.exists, 60, f"paused in {state} again")
        marker.unlink()
        assert controller.final("fd-2", good).status == "ok", state
        wait_for(_serves(agent, version), 30, f"v{version} served")
