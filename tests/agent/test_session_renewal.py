"""After a failed allocation the ONNX Runtime runner serves from a fresh session (its arena was sized by the failure).

The session factory is the seam: each session is a real CPU session, wrapped so that a test can make
its next run fail as onnxruntime does when an allocation fails, or present the placement another
provider would report. The end-to-end cases (a real address-space cap, a real memory cgroup) are in
tests/agent/test_serving_limits.py and tests/agent/test_memory_cgroup.py.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from edgecore.backends.base import Runner
from edgecore.backends.onnxruntime import TENSORRT_EP, OrtRunner, OrtSessionLoader
from edgectl.examples import tiny_classifier


class _Assigned:
    """One entry of get_provider_graph_assignment_info: every node of the graph on one provider."""

    def __init__(self, ep_name: str, nodes: int) -> None:
        self.ep_name, self._nodes = ep_name, nodes

    def get_nodes(self) -> list[int]:
        return list(range(self._nodes))


class _Session:
    """A real CPU session whose next run can be made to fail, placed on ``provider`` as far as the runner can tell."""

    def __init__(self, path: str, provider: str) -> None:
        self.real = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        self.provider = provider
        self.fail_with: str | None = None
        self.gate: threading.Event | None = None  # the next run waits for it, then fails for memory
        self.waiting = threading.Event()  # set once a run waits for its gate

    def run(self, names: list[str], feeds: dict[str, Any]) -> Any:
        gate, self.gate = self.gate, None
        if gate is not None:
            self.waiting.set()
            gate.wait(30)
            raise RuntimeError(OOM)
        if self.fail_with is not None:
            message, self.fail_with = self.fail_with, None
            raise RuntimeError(message)
        return self.real.run(names, feeds)

    def get_inputs(self) -> Any:
        return self.real.get_inputs()

    def get_outputs(self) -> Any:
        return self.real.get_outputs()

    def get_providers(self) -> list[str]:
        return [self.provider, "CPUExecutionProvider"]

    def get_provider_graph_assignment_info(self) -> list[_Assigned]:
        return [_Assigned(self.provider, 3)]


class _Factory:
    """Builds _Session objects; ``providers`` says where each next one is placed."""

    def __init__(self, *providers: str) -> None:
        self.providers = list(providers)
        self.built: list[_Session] = []
        self.hold: threading.Event | None = None  # a rebuild waits for it
        self.building = threading.Event()  # set once a held rebuild is waiting

    def __call__(self, path: str, options: Any, providers: list[Any]) -> _Session:
        if self.built and self.hold is not None:
            self.building.set()
            self.hold.wait(30)
        session = _Session(path, self.providers[min(len(self.built), len(self.providers) - 1)])
        self.built.append(session)
        return session


FEEDS = {"image": np.zeros((1, 3, 32, 32), np.float32)}
OOM = "Non-zero status code returned while running Conv node. Status Message: std::bad_alloc"


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return tiny_classifier(tmp_path / "m.onnx", seed=3)


def _fail_next(factory: _Factory, runner: Runner, message: str) -> None:
    factory.built[-1].fail_with = message
    with pytest.raises(RuntimeError, match=message[-20:]):
        runner.infer(FEEDS)


def test_a_failed_allocation_renews_the_session_once_and_the_next_request_is_served(model: Path) -> None:
    factory = _Factory("CPUExecutionProvider")
    with OrtRunner(OrtSessionLoader(model, session_factory=factory)) as runner:
        expected = runner.infer(FEEDS)
        _fail_next(factory, runner, OOM)
        assert len(factory.built) == 2  # a fresh session, built once
        again = runner.infer(FEEDS)
        assert all(np.array_equal(again[name], value) for name, value in expected.items())
        _fail_next(factory, runner, "[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Invalid input shape")
        assert len(factory.built) == 2  # any other failure leaves the session as it is


def test_the_old_session_keeps_serving_when_a_fresh_one_cannot_be_built(model: Path, tmp_path: Path) -> None:
    """The model file went away (the TensorRT loader hashes it for its engine cache): the old session serves on."""
    factory = _Factory(TENSORRT_EP)
    with OrtRunner(OrtSessionLoader(model, TENSORRT_EP, cache_dir=tmp_path / "compiled", session_factory=factory)) as runner:
        model.unlink()
        _fail_next(factory, runner, OOM)  # the request's own error, not the failed rebuild's
        assert len(factory.built) == 1 and runner.infer(FEEDS)


def test_a_fresh_session_that_lost_the_accelerator_is_not_taken(model: Path) -> None:
    """After a GPU allocation failed, a fresh session may come up on the CPU alone: the old one, on TensorRT, stays."""
    factory = _Factory(TENSORRT_EP, "CPUExecutionProvider")
    with OrtRunner(OrtSessionLoader(model, TENSORRT_EP, cache_dir=None, session_factory=factory)) as runner:
        first = factory.built[0]
        _fail_next(factory, runner, OOM)
        assert len(factory.built) == 2 and runner.placement.effective == TENSORRT_EP
        first.fail_with = OOM  # the old session is still the one that runs
        with pytest.raises(RuntimeError):
            runner.infer(FEEDS)



def _infer_in_thread(runner: Runner, errors: list[BaseException]) -> threading.Thread:
    def run() -> None:
        try:
            runner.infer(FEEDS)
        except Exception as exc:  # the test reads what each request met
            errors.append(exc)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_failure_during_a_renewal_neither_waits_for_it_nor_builds_another(model: Path) -> None:
    factory = _Factory("CPUExecutionProvider")
    factory.hold = threading.Event()
    with OrtRunner(OrtSessionLoader(model, session_factory=factory)) as runner:
        first = factory.built[0]
        errors: list[BaseException] = []
        first.fail_with = OOM
        renewing = _infer_in_thread(runner, errors)
        assert factory.building.wait(30), "the renewal did not start"
        first.fail_with = OOM  # another request on the old session fails meanwhile
        other = _infer_in_thread(runner, errors)
        other.join(10)
        assert not other.is_alive(), "a request waited for another's renewal"
        factory.hold.set()
        renewing.join(30)
        assert len(errors) == 2 and len(factory.built) == 2


def test_a_late_failure_of_a_replaced_session_builds_nothing(model: Path) -> None:
    factory = _Factory("CPUExecutionProvider")
    with OrtRunner(OrtSessionLoader(model, session_factory=factory)) as runner:
        first, gate = factory.built[0], threading.Event()
        errors: list[BaseException] = []
        first.gate = gate
        late = _infer_in_thread(runner, errors)  # runs on the first session, fails once let go
        assert first.waiting.wait(30)
        _fail_next(factory, runner, OOM)  # the first session fails again: renewed
        assert len(factory.built) == 2
        gate.set()
        late.join(30)
        assert len(errors) == 1 and len(factory.built) == 2  # the session it ran on was replaced already


def test_a_runner_deactivated_during_a_renewal_is_not_revived(model: Path) -> None:
    factory = _Factory("CPUExecutionProvider")
    factory.hold = threading.Event()
    runner = OrtRunner(OrtSessionLoader(model, session_factory=factory))
    runner.activate()
    errors: list[BaseException] = []
    factory.built[0].fail_with = OOM
    renewing = _infer_in_thread(runner, errors)
    assert factory.building.wait(30), "the renewal did not start"
    closing = threading.Thread(target=runner.deactivate, daemon=True)
    closing.start()
    deadline = time.monotonic() + 30
    while runner.is_active and time.monotonic() < deadline:  # deactivate marks it first, then frees the session
        time.sleep(0.01)
    time.sleep(0.2)  # time to free it at once, were it not waiting for the renewal
    factory.hold.set()
    closing.join(30)
    renewing.join(30)
    assert not runner.is_active and len(factory.built) == 2
    assert runner._session is None  # the fresh session was not kept past the deactivation (it would hold its memory)
