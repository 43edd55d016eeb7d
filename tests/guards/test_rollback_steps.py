"""The device's terminal states in process: ROLLBACK puts the committed model back and serves it, whatever state
the deployment stopped in; FAILURE and COMMIT; and a restart that must not serve an uncommitted model.

Real slots, a real ModelHost loading real packaged models (the selection cached across the module,
so each load after the first is quick), the real handlers of ``agent.deploy.steps``.
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.config import DeploySettings
from agent.deploy.machine import Deployment, Event, Outcome, State
from agent.deploy.slots import ActiveModel, Slots
from agent.deploy.steps import Steps
from agent.hardware import probe_hardware
from agent.model_host import ModelHost
from agent.serving import ModelRegistry
from edgecore.delivery.download import Download
from edgecore.protocol.ledger import Ledger
from edgectl.examples import tiny_classifier
from tests.agent.serving_host import install


@dataclass
class Device:
    steps: Steps
    slots: Slots
    host: ModelHost
    v1: ActiveModel
    v2: ActiveModel
    v2_manifest: bytes

    def deployment(self, state: State, unpacked: bool = True) -> Deployment:
        """The deployment of v2, saved in ``state``; ``unpacked``: VERIFY put it in its slot."""
        deployment = Deployment.single("dep-2", self.v2_manifest, state=state)
        if unpacked:
            deployment.parts[0].learn(slot=self.v2.slot)
        return deployment

    def serving(self) -> int | None:
        loaded = self.host.loaded("m")
        return None if loaded is None else loaded.active.version


def _no_fetch(_download: Download) -> None:
    raise AssertionError("these states download nothing")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    folder = tmp_path_factory.mktemp("models")
    return tiny_classifier(folder / "v1.onnx", size=8), tiny_classifier(folder / "v2.onnx", size=8), folder / "selection"


def _device(state: Path, models: tuple[Path, Path, Path], work: Path) -> Device:
    """v1 committed and served; v2 unpacked in the spare slot, not yet active."""
    slots = Slots(state)
    v1, _ = install(models[0], "m", 1, slots, work)
    slots.activate(v1)
    v2, _ = install(models[1], "m", 2, slots, work)
    host = ModelHost(slots, ModelRegistry(), probe_hardware(), models[2], budget_s=0.2)
    host.load(v1)
    steps = Steps(DeploySettings(), state, slots, Ledger(state), host, _no_fetch, None)
    steps.downloads.mkdir(parents=True, exist_ok=True)
    return Device(steps, slots, host, v1, v2, (slots.dir(v2.slot) / "manifest.json").read_bytes())


@pytest.fixture
def device(tmp_path: Path, models: tuple[Path, Path, Path]) -> Device:
    return _device(tmp_path / "state", models, tmp_path)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 2 MiB tmpfs for the state directory: ENOSPC from the kernel. Skips where mounting is not allowed."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {done.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def _activated(device: Device) -> None:
    """As ACTIVATE leaves it: the pointer on v2, v2 served."""
    device.slots.activate(device.v2)
    device.host.load(device.v2)


def test_a_rollback_after_activate_serves_the_committed_model_again(device: Device) -> None:
    _activated(device)
    deployment = device.deployment(State.ROLLBACK)
    (device.steps.downloads / f"{deployment.parts[0].manifest.payload.sha256}.payload").write_bytes(b"x")
    assert device.steps.rollback(deployment) is Event.SUCCESS
    assert deployment.outcome is Outcome.ROLLED_BACK
    assert device.slots.active("m") == device.v1 and device.serving() == 1
    assert not device.slots.dir(device.v2.slot).exists()  # the uncommitted model's slot is cleared
    assert list(device.steps.downloads.iterdir()) == []  # and its download


def test_a_rollback_before_the_pointer_moved_keeps_what_serves(device: Device) -> None:
    deployment = device.deployment(State.ROLLBACK)
    assert device.steps.rollback(deployment) is Event.SUCCESS
    assert device.slots.active("m") == device.v1 and device.slots.previous("m") is None and device.serving() == 1
    assert deployment.outcome is Outcome.ROLLED_BACK and not device.slots.dir(device.v2.slot).exists()


def test_a_rollback_after_a_restart_loads_the_committed_model(tmp_path: Path, models: tuple[Path, Path, Path]) -> None:
    """Restarted in ROLLBACK, nothing is served yet: the rollback loads the committed model itself."""
    device = _device(tmp_path / "state", models, tmp_path)
    fresh = ModelHost(device.slots, ModelRegistry(), probe_hardware(), models[2], budget_s=0.2)
    steps = Steps(DeploySettings(), tmp_path / "state", device.slots, Ledger(tmp_path / "state"), fresh, _no_fetch, None)
    assert fresh.loaded("m") is None
    assert steps.rollback(device.deployment(State.ROLLBACK)) is Event.SUCCESS
    loaded = fresh.loaded("m")
    assert loaded is not None and loaded.active == device.v1


def test_a_rollback_of_a_first_install_serves_nothing(device: Device, tmp_path: Path, models: tuple[Path, Path, Path]) -> None:
    slots = Slots(tmp_path / "first")
    only, _ = install(models[1], "m", 2, slots, tmp_path / "first")
    slots.activate(only)
    host = ModelHost(slots, ModelRegistry(), probe_hardware(), models[2], budget_s=0.2)
    host.load(only)
    steps = Steps(DeploySettings(), tmp_path / "first", slots, Ledger(tmp_path / "first"), host, _no_fetch, None)
    deployment = Deployment.single("dep-1", (slots.dir(only.slot) / "manifest.json").read_bytes(), state=State.ROLLBACK)
    deployment.parts[0].learn(slot=only.slot)
    assert steps.rollback(deployment) is Event.SUCCESS
    assert slots.active("m") is None and host.loaded("m") is None and not slots.dir(only.slot).exists()


def test_a_rollback_on_a_full_disk_still_serves_the_committed_model(small_disk: Path, tmp_path: Path,
                                                                    models: tuple[Path, Path, Path]) -> None:
    device = _device(small_disk / "state", models, tmp_path)
    _activated(device)
    with (small_disk / "filler").open("wb", buffering=0) as filler, contextlib.suppress(OSError):
        while True:  # fill the disk to its last byte
            filler.write(b"\0" * 4096)
    deployment = device.deployment(State.ROLLBACK)
    assert device.steps.rollback(deployment) is Event.FAILURE  # said so, but not left half-way
    assert "rollback could not save the slot pointer" in deployment.reason and deployment.outcome is Outcome.ROLLED_BACK
    assert device.serving() == 1  # the pointer is put back at the next start (restore_committed)
    assert device.slots.active("m") == device.v2
    assert not device.steps.restore_committed(device.deployment(State.ROLLBACK))  # not while the disk is full: say so
    assert device.slots.active("m") == device.v2 and device.slots.dir(device.v2.slot).exists()  # the slot pointed at stays
    (small_disk / "filler").unlink()
    assert device.steps.restore_committed(device.deployment(State.ROLLBACK)) and device.slots.active("m") == device.v1


def test_after_a_restart_in_rollback_the_committed_model_is_pointed_at_before_serving(device: Device) -> None:
    device.slots.activate(device.v2)  # the pointer moved, then the device restarted
    assert device.steps.restore_committed(device.deployment(State.ROLLBACK))
    assert device.slots.active("m") == device.v1
    device.slots.activate(device.v2)
    for untouched in (device.deployment(State.COMMIT), device.deployment(State.ROLLBACK, unpacked=False)):
        assert device.steps.restore_committed(untouched)
        assert device.slots.active("m") == device.v2  # COMMIT resumes; a deployment that unpacked nothing moved nothing


def test_a_restart_finds_the_pointer_already_back(device: Device) -> None:
    assert device.steps.restore_committed(device.deployment(State.ROLLBACK))
    assert device.slots.active("m") == device.v1


def test_failure_clears_what_the_deployment_unpacked_and_says_it_failed(device: Device, caplog: pytest.LogCaptureFixture) -> None:
    deployment = device.deployment(State.FAILURE)
    assert device.steps.failure(deployment) is Event.SUCCESS
    assert deployment.outcome is Outcome.FAILED and not device.slots.dir(device.v2.slot).exists()
    assert device.slots.active("m") == device.v1 and device.slots.dir(device.v1.slot).exists()
    kept = device.deployment(State.FAILURE, unpacked=False)
    kept.outcome = Outcome.ROLLED_BACK
    device.steps.failure(kept)
    assert kept.outcome is Outcome.ROLLED_BACK  # an outcome already known is kept
    device.steps.failure(device.deployment(State.FAILURE))  # its slot is gone already: nothing to clear, nothing wrong
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_commit_that_cannot_be_saved_fails_with_the_reason(device: Device) -> None:
    _activated(device)
    (device.steps.ledger.path).mkdir()  # where the ledger goes: its write fails
    deployment = device.deployment(State.COMMIT)
    assert device.steps.commit(deployment) is Event.FAILURE
    assert deployment.reason.startswith("commit: cannot save the ledger") and deployment.outcome is None


def test_commit_moves_the_ledger_and_says_ok(device: Device) -> None:
    _activated(device)
    deployment = device.deployment(State.COMMIT)
    assert device.steps.commit(deployment) is Event.SUCCESS
    assert deployment.outcome is Outcome.OK and deployment.reason == "m v2 committed"
    assert device.steps.ledger.version("m") == 2 and device.slots.dir(device.v2.slot).exists()
