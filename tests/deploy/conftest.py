"""Fixtures for deploy tests: one broker, one edgectl home and one in-process controller per test."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from edgectl.examples import tiny_classifier
from tests.brokers import BrokerProcess
from tests.deploy.controller import Controller, PausableAgent
from tests.fleet import EdgectlHome


@pytest.fixture
def home(tmp_path: Path, mosquitto: BrokerProcess, home_for: Callable[..., EdgectlHome]) -> EdgectlHome:
    return home_for(tmp_path, mosquitto)


@pytest.fixture
def controller(tmp_path: Path, home: EdgectlHome) -> Iterator[Controller]:
    ctl = Controller(home, tmp_path / "controller")
    yield ctl
    ctl.close()


@pytest.fixture
def pausable(tmp_path: Path, home: EdgectlHome) -> Iterator[Callable[..., PausableAgent]]:
    """Factory: pausable("dev", extra=...) starts an agent that a test can restart with a pause hook."""
    started: list[PausableAgent] = []

    def start(device_id: str, **kwargs: Any) -> PausableAgent:
        agent = PausableAgent(device_id, tmp_path / device_id, home.broker_url, [home.public_key("package")],
                              [home.public_key("controller")], **kwargs)
        started.append(agent)
        agent.start()
        return agent

    yield start
    for agent in started:
        agent.stop()


@pytest.fixture
def model_v(tmp_path: Path) -> Callable[[int], Path]:
    """model_v(n): a tiny classifier whose weights depend on n (8x8 inputs keep every step fast)."""
    def make(n: int, **kwargs: int) -> Path:
        return tiny_classifier(tmp_path / f"model-{n}-{len(kwargs)}.onnx", size=8, seed=n, **kwargs)
    return make


def mount_small_disk(mount_point: Path, size: str = "4m") -> Path:
    """A real small filesystem (tmpfs) at ``mount_point``: ENOSPC from the kernel, not from a seam. Skips without root."""
    mount_point.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root or CAP_SYS_ADMIN): {done.stderr.strip()}")
    return mount_point


@pytest.fixture
def small_disks(tmp_path: Path) -> Iterator[Callable[[Path], Path]]:
    """Factory: small_disks(path) mounts a 4 MiB tmpfs there; all are unmounted after the test."""
    mounted: list[Path] = []

    def mount(path: Path) -> Path:
        mounted.append(mount_small_disk(path))
        return path

    yield mount
    for path in reversed(mounted):
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.fixture
def small_disk(tmp_path: Path, small_disks: Callable[[Path], Path]) -> Path:
    """A real 4 MiB filesystem (tmpfs) that tests fill up."""
    return small_disks(tmp_path / "small-disk")


def fill(disk: Path, leave_bytes: int = 0) -> Path:
    """Fill ``disk`` until only ``leave_bytes`` are free; delete the returned file to give the space back."""
    filler = disk / "filler"
    with filler.open("ab", buffering=0) as f:
        block = max(shutil.disk_usage(disk).free - leave_bytes, 0)
        while block >= 4096:  # halve the block on ENOSPC: ends with less than one page free beyond ``leave_bytes``
            with contextlib.suppress(OSError):
                f.write(b"\0" * block)
            block = min(block // 2, max(shutil.disk_usage(disk).free - leave_bytes, 0))
    return filler
