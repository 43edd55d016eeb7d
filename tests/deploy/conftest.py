"""Fixtures for deploy tests: one broker, one edgectl home and one in-process controller per test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

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

    def start(device_id: str, **kwargs: object) -> PausableAgent:
        agent = PausableAgent(device_id, tmp_path / device_id, home.broker_url, [home.public_key("package")],
                              [home.public_key("controller")], **kwargs)  # type: ignore[arg-type]
        started.append(agent)
        return agent.start()

    yield start
    for agent in started:
        agent.stop()


@pytest.fixture
def model_v(tmp_path: Path) -> Callable[[int], Path]:
    """model_v(n): a tiny classifier whose weights depend on n (8x8 inputs keep every step fast)."""
    def make(n: int, **kwargs: int) -> Path:
        return tiny_classifier(tmp_path / f"model-{n}-{len(kwargs)}.onnx", size=8, seed=n, **kwargs)
    return make
