"""Fixtures that start real brokers and agents; each test gets its own, on free ports."""

from __future__ import annotations

import logging
import os
import resource
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.adversarial.hostile import HostileOrigin
from tests.brokers import BrokerProcess, mosquitto_binary, start_embedded, start_mosquitto
from tests.checkout import checkout_env
from tests.fleet import AgentProcess, EdgectlHome

# Subprocesses that tests start without an environment of their own import this checkout's code too.
os.environ["PYTHONPATH"] = checkout_env()["PYTHONPATH"]


# The worker's limits as it started, before any test or fixture could change them.
LIMITS = {limit: resource.getrlimit(limit) for limit in (resource.RLIMIT_AS, resource.RLIMIT_NOFILE)}


def restore_limits() -> None:
    """Put the process's resource limits back to what the worker started with (a child started after inherits them)."""
    for limit, wanted in LIMITS.items():
        if resource.getrlimit(limit) != wanted:
            resource.setrlimit(limit, wanted)


@pytest.fixture(autouse=True)
def process_state_kept() -> Iterator[None]:
    """Every test starts and ends with the worker's own resource limits and leaves the root log level as it found it.

    An inference server started in process caps RLIMIT_AS (agent/serving/memory.py, as the agent does at start), in a
    test or in a module's fixture; every process the worker starts later inherits the cap, and a browser, which
    reserves far more address space than it uses, dies at start (chromedriver exit -5). An agent run in process
    applies a remote configuration's log level to the root logger (agent/remote_config.py), and a later test's warnings
    were then dropped."""
    restore_limits()
    level = logging.getLogger().level
    yield
    restore_limits()
    logging.getLogger().setLevel(level)


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A fresh Mosquitto on a free port (plaintext, anonymous, loopback only)."""
    if mosquitto_binary() is None:
        pytest.fail("mosquitto is not installed: ./scripts/test installs it (apt-get install mosquitto)")
    broker = start_mosquitto(tmp_path / "mosquitto")
    yield broker
    broker.stop()


@pytest.fixture
def embedded_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """The embedded amqtt broker that ./scripts/demo uses, in its own process."""
    broker = start_embedded(tmp_path / "embedded")
    yield broker
    broker.stop()


@pytest.fixture(params=["mosquitto", "embedded"])
def any_broker(request: pytest.FixtureRequest) -> BrokerProcess:
    """Each test using this runs once on Mosquitto and once on the embedded broker."""
    broker: BrokerProcess = request.getfixturevalue("mosquitto" if request.param == "mosquitto" else "embedded_broker")
    return broker


def _home(tmp_path: Path, broker: BrokerProcess) -> EdgectlHome:
    home = EdgectlHome(tmp_path / "edgectl-home", broker.url)
    home.path.mkdir()
    home.init_keys()
    return home


@pytest.fixture
def edgectl_home(tmp_path: Path, mosquitto: BrokerProcess) -> EdgectlHome:
    return _home(tmp_path, mosquitto)


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[Callable[..., AgentProcess]]:
    """Factory: agents(home, "dev-1", target=..., extra={...}) starts a real agent process."""
    started: list[AgentProcess] = []

    def start(home: EdgectlHome, device_id: str, **kwargs: Any) -> AgentProcess:
        agent = AgentProcess(device_id, tmp_path / device_id, home.broker_url, [home.public_key("package")],
                             [home.public_key("controller")], **kwargs)
        started.append(agent.start())
        return agent

    yield start
    for agent in started:
        agent.stop()


@pytest.fixture
def home_for() -> Callable[[Path, BrokerProcess], EdgectlHome]:
    return _home


@pytest.fixture(scope="module")
def stopping() -> Iterator[list[threading.Thread]]:
    """Agents and controllers stop in the background (an agent's inference server takes half a second):
    every thread put here must be gone by the module's end."""
    threads: list[threading.Thread] = []
    yield threads
    for thread in threads:
        thread.join(10)
    assert not [t for t in threads if t.is_alive()], "an agent or controller did not stop"


@pytest.fixture
def origins() -> Iterator[Callable[..., HostileOrigin]]:
    """Factory: origins(behaviour) starts a hostile HTTP origin (tests/adversarial/hostile.py), stopped afterwards."""
    started: list[HostileOrigin] = []

    def start(behaviour: object) -> HostileOrigin:
        origin = HostileOrigin(behaviour)  # type: ignore[arg-type]
        started.append(origin)
        return origin

    yield start
    for origin in started:
        origin.stop()
