"""HEALTH: models that load but crash, answer NaN or run too slowly are rolled back automatically."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort

from edgecore.protocol.manifest import TargetInfo
from tests.deploy.controller import Controller
from tests.deploy.models import crashing_model, nan_model
from tests.deploy.test_rejections import DEPLOY, serves
from tests.fleet import AgentProcess, EdgectlHome

CPU_ONLY = TargetInfo("any", ("CPUExecutionProvider",))


def _median_ms(model: Path) -> float:
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    x = {"image": np.zeros((1, 3, 8, 8), np.float32)}
    times = []
    for _ in range(30):
        start = time.perf_counter()
        session.run(None, x)
        times.append((time.perf_counter() - start) * 1000)
    return float(np.median(times))


def test_unhealthy_models_roll_back(tmp_path: Path, home: EdgectlHome, controller: Controller,
                                    agents: Callable[..., AgentProcess], model_v: Callable[..., Path]) -> None:
    agent = agents(home, "h-1", extra={"deploy": DEPLOY})
    assert controller.final("h-1", controller.desired("h-1", controller.package(model_v(1), "m", 1))).status == "ok"
    slow = model_v(2, extra_matmuls=40)
    cases = {
        # No golden data: STAGE runs them once on inputs made from the signature, under limits; a NaN passes
        # there (nothing to compare with) and HEALTH refuses it, a crash already fails in STAGE.
        "nan": controller.package(nan_model(tmp_path / "nan.onnx"), "m", 2, golden_samples=0),
        "crash": controller.package(crashing_model(tmp_path / "crash.onnx"), "m", 2, golden_samples=0, target=CPU_ONLY),
        # Bound = a third of what this model takes: it is 3x slower than allowed.
        "slow": controller.package(slow, "m", 2, health={"max_latency_ms": _median_ms(slow) / 3}),
    }
    expected = {"nan": ("health", "NaN"), "crash": ("stage", "out of data bounds"), "slow": ("health", "exceeds the bound")}
    for case, package in cases.items():
        deployment = controller.desired("h-1", package)
        final = controller.final("h-1", deployment)
        states = [s for s, _ in controller.history("h-1", deployment)]
        failed_in, reason = expected[case]
        undo, status = ("failure", "failed") if failed_in == "stage" else ("rollback", "rolled-back")
        assert final.status == status, f"{case}: {final.status} {final.detail}"
        assert states[-3:] == [failed_in, undo, "done"], f"{case}: {states}"
        assert reason in final.detail, f"{case}: {final.detail}"
        assert serves(agent, "m", 1), f"{case}: v1 is not back"
