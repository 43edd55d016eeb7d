"""SHADOW: before cut-over the new model answers beside the serving one; too little agreement keeps the old one."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tests.deploy.controller import Controller
from tests.deploy.test_rejections import DEPLOY, serves
from tests.fleet import AgentProcess, EdgectlHome


def _infer(agent: AgentProcess, seed: int) -> None:
    x = np.random.default_rng(seed).standard_normal((1, 3, 8, 8)).astype(np.float32)
    body = {"inputs": [{"name": "image", "shape": [1, 3, 8, 8], "datatype": "FP32", "data": x.ravel().tolist()}]}
    assert agent.http("/v2/models/m/infer", json.dumps(body).encode())["outputs"]


def test_shadow_run_measures_agreement_and_blocks_a_model_that_answers_differently(
        home: EdgectlHome, controller: Controller, agents: Callable[..., AgentProcess], model_v: Callable[..., Path]) -> None:
    agent = agents(home, "s-1", extra={"deploy": DEPLOY})
    assert controller.final("s-1", controller.desired("s-1", controller.package(model_v(1), "m", 1))).status == "ok"
    for seed in range(3):  # live requests: the shadow run replays them
        _infer(agent, seed)

    # The same classifier with near-identity layers appended: same answers, so it cuts over.
    same = controller.package(model_v(1, extra_matmuls=2), "m", 2)
    deployment = controller.desired("s-1", same, shadow={"min_agreement": 0.95})
    final = controller.final("s-1", deployment)
    assert final.status == "ok", final.detail
    shadow = final.data["shadow"]
    assert shadow["agreement"] >= 0.95 and shadow["samples"] >= 16 and shadow["live"] == 3, shadow
    assert [s for s, _ in controller.history("s-1", deployment)][2:5] == ["stage", "shadow", "activate"]

    # Other weights: other answers. It never becomes active; v2 keeps serving.
    other = controller.package(model_v(3), "m", 3)
    deployment = controller.desired("s-1", other, shadow={"min_agreement": 0.99})
    final = controller.final("s-1", deployment)
    assert final.status == "failed", final.detail
    assert final.detail.startswith("shadow: the new model agrees with the serving one on"), final.detail
    assert final.data["shadow"]["agreement"] < 0.99 and final.data["shadow"]["first_difference"]
    assert "activate" not in [s for s, _ in controller.history("s-1", deployment)]
    assert serves(agent, "m", 2)

    since = len(controller.events)
    controller.desired("s-1", other, shadow={"min_agreement": "most"})
    assert "options.shadow must be" in controller.rejection("s-1", since).detail
    assert serves(agent, "m", 2)
