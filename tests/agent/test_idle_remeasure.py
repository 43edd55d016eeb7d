"""Background re-measurement on real runtimes, driven by an injected clock and idle signal.

The served model casts floats to uint8: onnxruntime runs it several times faster than OpenVINO,
and the two agree on values within 0..255 but not beyond (onnxruntime wraps 300 to 44, OpenVINO
saturates it to 255), so live requests decide whether the shadow path lets a switch through. The
agent starts on a stale cached pick (OpenVINO, chosen by the estimate), as after a busy hour.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from agent.catalog import Candidate
from agent.config import RemeasureSettings
from agent.deploy.slots import Slots
from agent.hardware import probe_hardware
from agent.idle_remeasure import DeviceActivity, IdleRemeasure, Remeasured, why_keep
from agent.model_host import LoadedModel, ModelHost
from agent.selection import Selection
from agent.serving import ModelRegistry
from agent.timing import Decision
from edgecore.errors import ConfigError
from tests.agent.serving_host import serving_host

pytest.importorskip("openvino", reason="OpenVINO is not installed: there is no second backend to switch to")

ORT_CPU = Candidate("onnxruntime", "CPUExecutionProvider")
OV_CPU = Candidate("openvino", "CPU")
SETTINGS = RemeasureSettings(every_s=3600.0, idle_s=60.0, max_load=0.5, budget_s=5.0, min_agreement=1.0)


class Clock:
    """Wall time as the test sets it."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Signal:
    """The idle signal as the test sets it: idle or not, and quiet for ``quiet_polls`` polls (None: always)."""

    def __init__(self, idle: bool = True, quiet_polls: int | None = None) -> None:
        self.is_idle = idle
        self.quiet_polls = quiet_polls
        self.polls = 0

    def idle(self) -> bool:
        return self.is_idle

    def quiet(self) -> bool:
        self.polls += 1
        return self.quiet_polls is None or self.polls <= self.quiet_polls


def cast_model(path: Path) -> Path:
    graph = helper.make_graph([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.UINT8)], "cast",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, ["N", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.fixture
def host(tmp_path: Path) -> ModelHost:
    """A host serving the cast model on OpenVINO, a stale pick made by the estimate."""
    return serving_host(cast_model(tmp_path / "cast.onnx"), tmp_path, stale=OV_CPU)


def live_requests(host: ModelHost, values: list[float]) -> None:
    """Inputs the served model answered, as the inference server keeps them for shadow runs."""
    with host.registry.acquire("m") as entry:
        for value in values:
            host.registry.remember_inputs(entry, {"x": np.full((1, 4), value, np.float32)})


def serving(host: ModelHost) -> LoadedModel:
    loaded = host.loaded("m")
    assert loaded is not None
    return loaded


def remeasure(host: ModelHost, signal: Signal, clock: Clock, reports: list[Remeasured]) -> IdleRemeasure:
    return IdleRemeasure(host, SETTINGS, signal, reports.append, clock=clock)


def test_it_switches_through_the_shadow_path_to_a_backend_faster_beyond_the_noise(host: ModelHost) -> None:
    live_requests(host, [3.0, 200.0])
    clock, reports = Clock(serving(host).selection.measured_at + SETTINGS.idle_s + 1), list[Remeasured]()
    result = remeasure(host, Signal(), clock, reports).tick()
    assert result is not None and reports == [result], reports
    assert (result.outcome, result.previous, result.backend) == ("switched", OV_CPU.name, ORT_CPU.name), result.detail
    assert result.selection is not None and result.selection["decision"]["rule"] == "faster"
    assert result.agreement is not None and result.agreement["agreement"] == 1.0 and result.agreement["live"] == 2
    assert result.cpu_s > 0  # the measuring child's CPU time, counted
    with host.registry.acquire("m") as entry:
        assert entry.runner.name == ORT_CPU.name  # serving moved
    assert serving(host).selection.backend == ORT_CPU.name
    assert host.load(serving(host).active).selection.backend == ORT_CPU.name  # and a restart keeps it (cached)


def test_a_faster_backend_that_answers_live_requests_otherwise_is_not_switched_to(host: ModelHost) -> None:
    live_requests(host, [3.0, 300.0])  # onnxruntime wraps 300 to 44, OpenVINO saturates it to 255
    clock, reports = Clock(serving(host).selection.measured_at + SETTINGS.idle_s + 1), list[Remeasured]()
    result = remeasure(host, Signal(), clock, reports).tick()
    assert result is not None and (result.outcome, result.backend) == ("kept", OV_CPU.name), result
    assert "agrees with openvino/CPU on" in result.detail and result.agreement is not None
    assert result.agreement["agreement"] < 1.0 and "differ" in result.agreement["first_difference"]
    with host.registry.acquire("m") as entry:
        assert entry.runner.name == OV_CPU.name


def test_nothing_is_measured_before_it_is_due_or_while_the_device_is_busy(host: ModelHost) -> None:
    measured_at = serving(host).selection.measured_at
    reports: list[Remeasured] = []
    early = remeasure(host, Signal(), Clock(measured_at + SETTINGS.idle_s - 1), reports)
    assert early.tick() is None
    busy = remeasure(host, Signal(idle=False), Clock(measured_at + SETTINGS.every_s), reports)
    assert busy.tick() is None
    off = IdleRemeasure(host, dataclasses.replace(SETTINGS, every_s=0), Signal(), reports.append,
                        clock=Clock(measured_at + 10 * SETTINGS.every_s))
    assert off.tick() is None and reports == []
    assert serving(host).selection.backend == OV_CPU.name


def test_a_request_stops_the_measurement_which_backs_off(host: ModelHost) -> None:
    clock, reports = Clock(serving(host).selection.measured_at + SETTINGS.idle_s + 1), list[Remeasured]()
    signal = Signal(quiet_polls=3)
    tuner = remeasure(host, signal, clock, reports)
    result = tuner.tick()
    assert result is not None and result.outcome == "stopped" and result.backend == OV_CPU.name, result
    assert signal.polls > 3  # it watched the signal while the child measured
    assert tuner.due_at(serving(host)) == clock.now + 2 * SETTINGS.idle_s
    signal.quiet_polls = None
    clock.now += SETTINGS.idle_s
    assert tuner.tick() is None  # backing off
    clock.now += SETTINGS.idle_s
    again = tuner.tick()
    assert again is not None and again.outcome == "switched", again
    assert tuner.due_at(serving(host)) >= clock.now + SETTINGS.every_s  # measured: the full period now
    assert tuner.tick() is None


def test_the_device_is_idle_after_idle_s_without_requests_or_jobs_and_with_the_cpu_free(tmp_path: Path) -> None:
    from tests.agent.test_backends import affine_model

    registry = ModelRegistry()
    registry.publish("m", "1", ORT_CPU.open(affine_model(tmp_path / "affine.onnx")))
    clock, load, jobs = Clock(0.0), [0.1], [False]
    activity = DeviceActivity(registry, lambda: jobs[0], SETTINGS, clock=clock, load=lambda: load[0])
    assert not activity.quiet()  # first look: nothing known yet
    clock.now = SETTINGS.idle_s
    assert activity.quiet() and activity.idle()
    registry.get("m").stats.record(0.001)  # a request was served
    assert not activity.quiet() and not activity.idle()
    clock.now += SETTINGS.idle_s - 1
    assert activity.quiet() and not activity.idle()
    clock.now += 1
    assert activity.idle()
    load[0] = 0.9
    assert activity.quiet() and not activity.idle()  # the CPU is busy with other work
    load[0], jobs[0] = 0.1, True
    assert not activity.quiet()
    registry.close()


@pytest.mark.parametrize(("key", "value"), [("min_agreement", 0.0), ("min_agreement", 1.5), ("budget_s", 0.0),
                                            ("every_s", -1.0)])
def test_settings_out_of_range_are_refused_naming_the_key(tmp_path: Path, key: str, value: float) -> None:
    idle_host = ModelHost(Slots(tmp_path), ModelRegistry(), probe_hardware(), tmp_path / "selection", budget_s=1.0)
    with pytest.raises(ConfigError, match=f"remeasure.{key} must be"):
        IdleRemeasure(idle_host, dataclasses.replace(SETTINGS, **{key: value}), Signal(), lambda r: None)


def _picked(candidate: Candidate, rule: str) -> Selection:
    decision = Decision(candidate.name, "other/CPU", 1.3, 1.1 if rule == "faster" else 0.9, 1.5, 12,
                        rule in ("p95", "memory", "order"), rule)
    return Selection(Path("m.onnx"), "ab" * 32, candidate, (), "key", "fp32", decision=decision)


@pytest.mark.parametrize(("rule", "moves"), [("faster", True), ("estimate", False), ("memory", False),
                                             ("order", False), ("p95", False)])
def test_only_a_winner_faster_beyond_the_noise_moves_serving(rule: str, moves: bool) -> None:
    serving = _picked(OV_CPU, "estimate")
    why = why_keep(serving, _picked(ORT_CPU, rule))
    assert (why is None) == moves, why
    assert why is None or "no backend is faster beyond the noise than openvino/CPU" in why
    assert "is still the pick" in (why_keep(serving, _picked(OV_CPU, "faster")) or "")
