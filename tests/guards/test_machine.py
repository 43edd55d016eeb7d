"""The device's deployment state machine in process, every edge of its table, as Mender's state tests do.

Each case is a row: the state in which to inject a failure (the handler returns FAILURE), an
exception or a power cut, the chain of states the machine must enter (before and after the
restart), and the outcome it must report. The handlers are scripted through the machine's
constructor (its seam); the record is a real file, saved before every state, and a power cut
restarts from what is on disk (:func:`load_record`), as a rebooted device does.

The expected chains and tables are written out here, not read from :mod:`agent.deploy.machine`,
so changing an edge fails until this file says the same.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from agent.deploy.machine import RECOVERY, TRANSITIONS, Deployment, Event, Machine, Outcome, State, load_record

D, V, ST, SH, A, H, C, R, F, DONE = (State.DOWNLOAD, State.VERIFY, State.STAGE, State.SHADOW, State.ACTIVATE, State.HEALTH,
                                     State.COMMIT, State.ROLLBACK, State.FAILURE, State.DONE)
OK, ROLLED_BACK, FAILED = Outcome.OK, Outcome.ROLLED_BACK, Outcome.FAILED
HAPPY = (D, V, ST, SH, A, H, C, DONE)

EDGES = {
    (D, Event.SUCCESS): V, (D, Event.FAILURE): F,
    (V, Event.SUCCESS): ST, (V, Event.FAILURE): F,
    (ST, Event.SUCCESS): SH, (ST, Event.FAILURE): F,
    (SH, Event.SUCCESS): A, (SH, Event.FAILURE): F,
    (A, Event.SUCCESS): H, (A, Event.FAILURE): R,
    (H, Event.SUCCESS): C, (H, Event.FAILURE): R,
    (C, Event.SUCCESS): DONE, (C, Event.FAILURE): R,
    (R, Event.SUCCESS): DONE, (R, Event.FAILURE): DONE,
    (F, Event.SUCCESS): DONE, (F, Event.FAILURE): DONE,
}
# Where a restarted device resumes: nothing before ACTIVATE touched the served model; from ACTIVATE
# to HEALTH the pointer may have moved to an uncommitted model, so it rolls back.
RESUME = {D: D, V: V, ST: ST, SH: SH, A: R, H: R, C: C, R: R, F: F, DONE: DONE}


class PowerCut(BaseException):
    """The device loses power: nothing after this line runs (the machine catches only Exception)."""


@dataclass
class Script:
    """The handlers of every state: SUCCESS, except where the case says otherwise.

    Terminal handlers set the outcome as the real ones do (agent.deploy.steps): COMMIT ok,
    ROLLBACK rolled-back, FAILURE failed unless already set."""

    fail_in: frozenset[State] = frozenset()
    raise_in: frozenset[State] = frozenset()
    cut_in: frozenset[State] = frozenset()  # cut the power while the state runs, once per state
    ran: list[State] = field(default_factory=list)
    on_run: Callable[[State], None] | None = None

    def handlers(self) -> dict[State, Callable[[Deployment], Event]]:
        return {state: self._handler(state) for state in State if state is not DONE}

    def _handler(self, state: State) -> Callable[[Deployment], Event]:
        def run(deployment: Deployment) -> Event:
            self.ran.append(state)
            if self.on_run is not None:
                self.on_run(state)
            if state in self.cut_in:
                self.cut_in = self.cut_in - {state}
                raise PowerCut(state.value)
            if state in (R, F):  # the real ones say so first: whatever fails after, the outcome is known
                deployment.outcome = ROLLED_BACK if state is R else deployment.outcome or FAILED
            if state in self.raise_in:
                raise RuntimeError("handler bug")
            if state is C:
                deployment.outcome = OK
            return Event.FAILURE if state in self.fail_in else Event.SUCCESS
        return run


@dataclass
class Device:
    """A record file, the machine's reports, and restarts after a power cut."""

    record: Path
    script: Script
    max_entries: int | None = None
    reported: list[tuple[State, Outcome | None]] = field(default_factory=list)

    def machine(self) -> Machine:
        def report(deployment: Deployment) -> None:
            self.reported.append((deployment.state, deployment.outcome))
        if self.max_entries is None:
            return Machine(self.record, self.script.handlers(), report)  # the default crash-loop limit
        return Machine(self.record, self.script.handlers(), report, max_entries=self.max_entries)

    def deploy(self, restarts: int = 5) -> Deployment:
        """Run a new deployment to DONE, restarting from the saved record after each power cut."""
        deployment = Deployment.single("dep-1", b"{}")
        for _ in range(restarts + 1):
            try:
                return self.machine().run(deployment)
            except PowerCut:
                loaded = load_record(self.record)
                assert loaded is not None, "no record to resume after a power cut"
                deployment = loaded
        raise AssertionError(f"still not done after {restarts} restarts")

    @property
    def chain(self) -> list[State]:
        return [state for state, _ in self.reported]


def device(tmp_path: Path, fail_in: frozenset[State] = frozenset(), raise_in: frozenset[State] = frozenset(),
           cut_in: frozenset[State] = frozenset()) -> Device:
    return Device(tmp_path / "state" / "deployment.json", Script(fail_in, raise_in, cut_in))


def test_the_transition_table_holds_exactly_these_edges() -> None:
    assert dict(TRANSITIONS) == EDGES


def test_a_restart_resumes_each_saved_state_where_the_table_says() -> None:
    assert dict(RECOVERY) == RESUME


# -- every edge: a failure, then an exception, injected in each state -------------------------------------

FAILURES = [  # (inject in, chain, outcome)
    (frozenset(), HAPPY, OK),
    (frozenset({D}), (D, F, DONE), FAILED),
    (frozenset({V}), (D, V, F, DONE), FAILED),
    (frozenset({ST}), (D, V, ST, F, DONE), FAILED),
    (frozenset({SH}), (D, V, ST, SH, F, DONE), FAILED),
    (frozenset({A}), (D, V, ST, SH, A, R, DONE), ROLLED_BACK),
    (frozenset({H}), (D, V, ST, SH, A, H, R, DONE), ROLLED_BACK),
    (frozenset({C}), (D, V, ST, SH, A, H, C, R, DONE), ROLLED_BACK),
    (frozenset({H, R}), (D, V, ST, SH, A, H, R, DONE), ROLLED_BACK),  # a failed rollback still ends
    (frozenset({D, F}), (D, F, DONE), FAILED),  # so does a failed clean-up
]
IDS = ["none", *("+".join(sorted(s.value for s in f[0])) for f in FAILURES[1:])]


@pytest.mark.parametrize(("inject", "chain", "outcome"), FAILURES, ids=IDS)
def test_a_failure_event_takes_the_failure_edge(tmp_path: Path, inject: frozenset[State], chain: tuple[State, ...],
                                                outcome: Outcome) -> None:
    dev = device(tmp_path, fail_in=inject)
    deployment = dev.deploy()
    assert dev.chain == list(chain)
    assert deployment.state is DONE and deployment.outcome is outcome and dev.reported[-1] == (DONE, outcome)
    assert dev.script.ran == list(chain[:-1])  # each state ran once, DONE runs nothing
    saved = load_record(dev.record)
    assert saved is not None and saved.state is DONE and saved.outcome is outcome


@pytest.mark.parametrize(("inject", "chain", "outcome"), FAILURES[1:], ids=IDS[1:])
def test_a_handler_that_raises_takes_the_failure_edge_and_says_why(tmp_path: Path, inject: frozenset[State],
                                                                   chain: tuple[State, ...], outcome: Outcome) -> None:
    dev = device(tmp_path, raise_in=inject)
    deployment = dev.deploy()
    assert dev.chain == list(chain) and deployment.outcome is outcome
    last = max(inject, key=chain.index)
    assert deployment.reason == f"{last.value}: internal error: handler bug"


# -- a power cut in each state: the record on disk says where the device resumes -------------------------

CUTS = [  # (cut in, failures injected first, chain before the cut, chain after the restart, outcome)
    (D, frozenset(), (D,), (D, V, ST, SH, A, H, C, DONE), OK),
    (V, frozenset(), (D, V), (V, ST, SH, A, H, C, DONE), OK),
    (ST, frozenset(), (D, V, ST), (ST, SH, A, H, C, DONE), OK),
    (SH, frozenset(), (D, V, ST, SH), (SH, A, H, C, DONE), OK),
    (A, frozenset(), (D, V, ST, SH, A), (R, DONE), ROLLED_BACK),
    (H, frozenset(), (D, V, ST, SH, A, H), (R, DONE), ROLLED_BACK),
    (C, frozenset(), (D, V, ST, SH, A, H, C), (C, DONE), OK),
    (R, frozenset({H}), (D, V, ST, SH, A, H, R), (R, DONE), ROLLED_BACK),
    (F, frozenset({V}), (D, V, F), (F, DONE), FAILED),
]


@pytest.mark.parametrize(("cut", "fail", "before", "after", "outcome"), CUTS, ids=[c[0].value for c in CUTS])
def test_a_power_cut_resumes_from_the_saved_state(tmp_path: Path, cut: State, fail: frozenset[State],
                                                  before: tuple[State, ...], after: tuple[State, ...],
                                                  outcome: Outcome) -> None:
    saved_when_cut: list[State | None] = []

    def on_run(state: State) -> None:
        if state is cut:
            record = load_record(dev.record)
            saved_when_cut.append(record.state if record is not None and not saved_when_cut else None)

    dev = device(tmp_path, fail_in=fail, cut_in=frozenset({cut}))
    dev.script.on_run = on_run
    deployment = dev.deploy()
    assert saved_when_cut[0] is RESUME[cut]  # saved before it ran, read back as a restart would
    assert dev.chain == [*before, *after]
    assert deployment.outcome is outcome and dev.reported[-1] == (DONE, outcome)


def test_an_unknown_saved_state_resumes_in_rollback(tmp_path: Path) -> None:
    dev = device(tmp_path, cut_in=frozenset({H}))
    with pytest.raises(PowerCut):
        dev.machine().run(Deployment.single("dep-1", b"{}"))
    dev.record.write_text(dev.record.read_text().replace('"state": "health"', '"state": "flashing"'))
    loaded = load_record(dev.record)
    assert loaded is not None and loaded.state is R


# -- the crash-loop escape, per state --------------------------------------------------------------------

LOOPS = [  # (state the device keeps dying in, failures before it, where the machine escapes to, outcome)
    (D, frozenset(), (R, DONE), ROLLED_BACK),
    (V, frozenset(), (R, DONE), ROLLED_BACK),
    (ST, frozenset(), (R, DONE), ROLLED_BACK),
    (SH, frozenset(), (R, DONE), ROLLED_BACK),
    (C, frozenset(), (R, DONE), ROLLED_BACK),
    (R, frozenset({H}), (DONE,), FAILED),  # a rollback that always kills the device: give up, and say it failed
    (F, frozenset({D}), (DONE,), FAILED),
]


def _dies_in(state: State) -> frozenset[State]:
    return frozenset({state})


@pytest.mark.parametrize(("state", "fail", "escape", "outcome"), LOOPS, ids=[loop[0].value for loop in LOOPS])
def test_a_state_that_kills_the_device_every_time_is_escaped_after_max_entries(
        tmp_path: Path, state: State, fail: frozenset[State], escape: tuple[State, ...], outcome: Outcome) -> None:
    dev = device(tmp_path, fail_in=fail)
    dev.max_entries = 3
    deaths = [0]

    def die(ran: State) -> None:
        if ran is state:
            deaths[0] += 1
            dev.script.cut_in = _dies_in(state)  # every time, not once

    dev.script.on_run = die
    deployment = dev.deploy(restarts=10)
    assert deaths[0] == 3  # entered and ran three times; the fourth entry escapes before running it
    assert dev.chain[-len(escape):] == list(escape) and dev.chain.count(state) == 3  # the 4th entry reports the escape
    assert deployment.reason == f"crash loop: entered {state.value} 3 times"
    assert deployment.outcome is outcome and dev.reported[-1] == (DONE, outcome)
    assert deployment.entries[state.value] == 4
    if escape[0] is R:
        assert deployment.entries[R.value] == 1  # the escape counts as an entry of ROLLBACK
    assert dev.reported.count((DONE, outcome)) == 1  # DONE is reported once, however it was reached


def test_two_restarts_in_one_state_are_within_the_limit(tmp_path: Path) -> None:
    """Three entries of a state are allowed (two restarts in it) with the default limit of three."""
    dev = device(tmp_path)
    cuts = [0]

    def twice(state: State) -> None:
        if state is V and cuts[0] < 2:
            cuts[0] += 1
            dev.script.cut_in = _dies_in(V)

    dev.script.on_run = twice
    deployment = dev.deploy()
    assert deployment.outcome is OK and dev.chain == [D, V, V, V, ST, SH, A, H, C, DONE]
    assert deployment.entries[V.value] == 3 and deployment.reason == ""


def test_the_default_limit_is_three_entries(tmp_path: Path) -> None:
    dev = device(tmp_path, fail_in=frozenset({H}))
    assert dev.max_entries is None  # the machine's own default

    def always(state: State) -> None:
        if state is R:
            dev.script.cut_in = _dies_in(R)

    dev.script.on_run = always
    deployment = dev.deploy(restarts=10)
    assert dev.chain.count(R) == 3 and deployment.reason == "crash loop: entered rollback 3 times"


# -- a record that cannot be saved ---------------------------------------------------------------------------


@pytest.mark.parametrize(("full_from", "chain", "ran", "outcome"), [
    (D, (D, F, DONE), (F,), FAILED),  # nothing may run that could not resume: only the clean-up
    (ST, (D, V, ST, F, DONE), (D, V, F), FAILED),
    (H, (D, V, ST, SH, A, H, R, DONE), (D, V, ST, SH, A, R), ROLLED_BACK),
])
def test_a_state_whose_record_cannot_be_saved_fails_without_running(tmp_path: Path, full_from: State,
                                                                     chain: tuple[State, ...], ran: tuple[State, ...],
                                                                     outcome: Outcome) -> None:
    dev = device(tmp_path)
    state_dir = dev.record.parent
    state_dir.mkdir(parents=True)
    previous = {D: None, ST: V, H: A}[full_from]

    def fill() -> None:  # the directory becomes a file: every later save fails with an OSError
        shutil.rmtree(state_dir)
        state_dir.write_text("")

    if previous is None:
        fill()
    dev.script.on_run = lambda state: fill() if state is previous else None
    deployment = dev.deploy()
    assert dev.chain == list(chain) and dev.script.ran == list(ran) and deployment.outcome is outcome
    assert f"{full_from.value}: cannot save the deployment record" in deployment.reason
