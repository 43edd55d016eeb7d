"""Signed commands and desired states against a real agent and Mosquitto: replay, reorder, expiry, forgery.

Each refused message must be reported (an event with status 'rejected'), counted in telemetry
('rejected_messages'), logged once, and must leave the active model and the ledger alone.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.brokers import BrokerProcess
from tests.fleet import AgentProcess, EdgectlHome, wait_for
from tests.security.crafted import Observer, command, controller_key, desired, make_package

DEVICE = "dev-1"
COMMANDS = f"edge/v1/devices/{DEVICE}/commands"
DESIRED = f"edge/v1/devices/{DEVICE}/desired"


def _last_seq(agent: AgentProcess) -> int:
    return int(json.loads((agent.state_dir / "ledger.json").read_text())["last_seq"])


@pytest.fixture
def deployed(tmp_path: Path, mosquitto: BrokerProcess, edgectl_home: EdgectlHome,
             agents: Callable[..., AgentProcess]) -> Iterator[tuple[AgentProcess, Observer]]:
    """dev-1 running model m v1, deployed by edgectl; an observer on its events and telemetry."""
    agent = agents(edgectl_home, DEVICE)
    observer = Observer.connect(mosquitto.port, DEVICE)
    package = make_package(edgectl_home, tmp_path / "pkg", "m", 1)
    edgectl_home.edgectl("deploy", str(package.path), "-d", DEVICE, "--timeout", "90", check=True)
    assert agent.active_version() == 1
    observer.reset()
    yield agent, observer
    observer.close()


def test_replayed_reordered_expired_and_forged_commands_are_refused(
    deployed: tuple[AgentProcess, Observer], edgectl_home: EdgectlHome
) -> None:
    agent, observer = deployed
    key, last, active = controller_key(edgectl_home), _last_seq(deployed[0]), agent.active()
    accepted = command(key, DEVICE, last + 10)
    observer.publish(COMMANDS, accepted)
    wait_for(lambda: _last_seq(agent) == last + 10, 20, "the signed command to be accepted")

    hostile = [
        (accepted, r"stale or replayed message: seq \d+ <= last accepted"),  # replay
        (command(key, DEVICE, last + 5), r"stale or replayed"),  # reordered: lower than the last accepted
        (command(key, DEVICE, last + 20, expires_in=-60), r"expired at"),
        (command(None, DEVICE, last + 21), r"no signature"),
        (command(Ed25519PrivateKey.generate(), DEVICE, last + 22), r"untrusted key"),
        (command(key, "dev-2", last + 23), r"addressed to dev-2, not dev-1"),
        (desired(key, DEVICE, last + 24), r"payload type .*desired.* is not the expected .*command"),
    ]
    for payload, _ in hostile:
        observer.publish(COMMANDS, payload)
    observer.wait_rejected(events=len(hostile), counted=len(hostile))

    details = [e["detail"] for e in observer.rejected_events()]
    for detail, (_, reason) in zip(details, hostile, strict=False):
        assert re.search(reason, detail), (detail, reason)
    assert _last_seq(agent) == last + 10, "a refused message moved the ledger"
    assert agent.active() == active and agent.model_ready("m") and agent.alive()
    assert not observer.other_events(), observer.events

    # The same bad message again is counted but not logged a second time.
    logged = agent.log_text().count("rejected message on")
    observer.publish(COMMANDS, accepted)
    observer.wait_rejected(events=len(hostile) + 1, counted=len(hostile) + 1)
    assert agent.log_text().count("rejected message on") == logged == len(hostile)


def test_stale_retained_and_replayed_desired_state_after_restart_do_nothing(
    tmp_path: Path, deployed: tuple[AgentProcess, Observer], edgectl_home: EdgectlHome
) -> None:
    agent, observer = deployed
    key, last, active = controller_key(edgectl_home), _last_seq(deployed[0]), agent.active()
    retained = observer.retained(DESIRED)  # the desired state edgectl deploy left on the broker
    newer = make_package(edgectl_home, tmp_path / "pkg2", "m", 2, seed=5)

    agent.stop()
    agent.start()  # the broker hands it the retained desired state, already handled before
    wait_for(lambda: agent.model_ready("m"), 30, "m served again after the restart")
    observer.settle()
    assert _last_seq(agent) == last and agent.active() == active
    assert not observer.other_events(), f"the stale desired state ran: {observer.events}"

    # Live replays: the old desired state itself, and a signed one for v2 with a lower sequence number.
    observer.publish(DESIRED, retained)
    observer.publish(DESIRED, desired(key, DEVICE, last - 1, newer))
    observer.settle(reports=3)
    assert agent.active() == active and _last_seq(agent) == last and agent.alive()
    assert not observer.other_events(), f"a replayed desired state ran: {observer.events}"
    replays_reported = len(observer.rejected_events())

    # After all that, a fresh signed desired state still deploys: the refusals left the agent healthy.
    edgectl_home.edgectl("deploy", str(newer.path), "-d", DEVICE, "--timeout", "90", check=True)
    assert agent.active_version() == 2

    assert replays_reported >= 2, "live replays of a desired state must be refused and reported"
    assert all("stale or replayed" in e["detail"] for e in observer.rejected_events())
