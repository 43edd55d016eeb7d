"""Power cuts during a pipeline swap: the device serves the whole old pipeline or the whole new one, never a mix.

A pipeline (a detector whose box feeds a classifier through an ONNX crop-and-resize graph) and its
two models move between two versions, all three in one desired set (one unit: one pointer write
switches them). The agent is killed (SIGKILL: a power cut as far as its files go) held in each state
where the pointer may move, and at random moments. After every cut, and once the deployment has
ended, the slot pointer names the three at one version, and the pipeline's answer is exactly that
version's answer run by hand: a mix (the new detector with the old classifier, or the reverse)
answers otherwise, which the test checks first so that it could see one.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import yaml

from edgecore.protocol.envelope import TrustedKeys
from edgectl.examples import tiny_classifier
from edgectl.package import Package, read_package
from edgectl.pipeline_package import PipelineOptions, build_pipeline
from tests.deploy.controller import Controller, PausableAgent
from tests.deploy.models import crop_resize_graph, tiny_detector
from tests.deploy.test_rejections import DEPLOY
from tests.e2e.test_pipeline import CPU_ONLY, STEPS, by_hand, infer
from tests.fleet import wait_for

RANDOM_CUTS = int(os.environ.get("EDGE_PIPELINE_CUTS", "2"))
SEED = int(os.environ.get("EDGE_PIPELINE_CUTS_SEED", str(random.SystemRandom().randrange(1 << 30))))
HELD = ("activate", "health", "commit")  # where the pointer moves, or has moved and is not committed yet
NAMES = ("det", "cls", "plates")


def _unit(controller: Controller, folder: Path, version: int) -> tuple[list[Package], Path, Path]:
    """det, cls and plates at ``version`` (other weights per version), served by the controller; and the ONNX files."""
    folder.mkdir()
    det = tiny_detector(folder / "det.onnx", seed=10 * version)
    cls = tiny_classifier(folder / "cls.onnx", size=16, seed=10 * version + 1)
    crop_resize_graph(folder / "crop.onnx")
    models = [controller.package(det, "det", version, target=CPU_ONLY), controller.package(cls, "cls", version, target=CPU_ONLY)]
    spec = folder / "plates.yaml"
    spec.write_text(yaml.safe_dump({"name": "plates", "models": {p.manifest.name: str(p.path) for p in models},
                                    "outputs": ["boxes", "scores"], "steps": STEPS}))
    key = controller.ring.signing_key("package")
    trusted = TrustedKeys([key.public_key()])
    _manifest, out = build_pipeline(spec, PipelineOptions(None, version), key, trusted, folder / "plates.edgepkg")
    (folder / "open").mkdir()
    pipeline = read_package(out, trusted, folder / "open")
    controller.serve(pipeline)
    return [*models, pipeline], det, cls


def _versions(agent: PausableAgent) -> set[int | None]:
    """The versions the slot pointer names for the three (one element when they agree)."""
    return {agent.active_version(name) for name in NAMES}


def _all_at(agent: PausableAgent, version: int) -> Callable[[], bool]:
    return lambda: _versions(agent) == {version}


def _send(controller: Controller, packages: list[Package]) -> str:
    """The set of ``packages``, every entry under one new deployment id (returned)."""
    deployment = f"d-{packages[0].manifest.version}-{time.monotonic_ns()}"
    controller.desired_set("pl-1", [(p, deployment) for p in packages if not p.manifest.is_pipeline],
                           [(p, deployment) for p in packages if p.manifest.is_pipeline], deployment_id=deployment,
                           allow_downgrade=True)
    return deployment


def test_power_cuts_during_a_pipeline_swap_never_serve_a_mixed_pipeline(tmp_path: Path, controller: Controller,
                                                                        pausable: Callable[..., PausableAgent]) -> None:
    rng = random.Random(SEED)
    print(f"pipeline power-cut seed {SEED} (EDGE_PIPELINE_CUTS_SEED to repeat)")
    deploy = {**DEPLOY, "health_runs": 2, "crash_loop_max_deaths": 1000}  # the cuts are not the models' doing
    agent = pausable("pl-1", extra={"deploy": deploy})
    units = {v: _unit(controller, tmp_path / f"v{v}", v) for v in (1, 2)}
    image = np.random.default_rng(3).random((1, 3, 32, 32), dtype=np.float32)
    crop = tmp_path / "v1" / "crop.onnx"
    answers = {v: by_hand(units[v][1], crop, units[v][2], image)["scores"] for v in (1, 2)}
    mixed = [by_hand(units[a][1], crop, units[b][2], image)["scores"] for a, b in ((1, 2), (2, 1))]
    for mix in mixed:  # a mixed pipeline would answer otherwise than either version: the test can see one
        assert not any(np.allclose(mix, answers[v], rtol=1e-4) for v in (1, 2))

    assert controller.final("pl-1", _send(controller, units[1][0]), 180).status == "ok"
    current = 1
    for where in [*HELD, *["random"] * RANDOM_CUTS]:
        target = 3 - current
        if where != "random":
            agent.stop()
            agent.pause_in = where
            agent.start()
        deployment = _send(controller, units[target][0])
        if where == "random":
            time.sleep(rng.uniform(0.5, 6.0))  # anywhere in the deployment, ACTIVATE's pointer write and loads included
        else:
            marker = agent.state_dir / f"paused-in-{where}"
            wait_for(marker.exists, 120, f"the agent held in {where}")
        agent.kill()
        after_cut = _versions(agent)
        assert len(after_cut) == 1, f"cut in {where}: the pointer names a mix {after_cut}"
        agent.pause_in = None
        for marker in agent.state_dir.glob("paused-in-*"):
            marker.unlink()
        agent.start()
        wait_for(lambda: agent.model_ready("plates"), 120, "the pipeline served after the restart")
        [served] = _versions(agent)
        assert served in (current, target), f"cut in {where}: restarted on v{served}"
        # Whichever version it is, all of it: the pipeline answers exactly as that version run by hand.
        np.testing.assert_allclose(infer(agent, "plates", image)["scores"], answers[served], rtol=1e-5, atol=1e-6,
                                   err_msg=f"cut in {where}: the pipeline does not answer as v{served}")
        final = controller.final("pl-1", deployment, 180)
        assert final.status in ("ok", "rolled-back", "failed"), final
        current = target if final.status == "ok" else current
        wait_for(_all_at(agent, current), 60, f"v{current} of all three")
        np.testing.assert_allclose(infer(agent, "plates", image)["scores"], answers[current], rtol=1e-5, atol=1e-6)
    history = [e for e in list(controller.events) if e.device_id == "pl-1" and e.state == "done"]
    assert {e.model for e in history} == set(NAMES)  # each part reported under its own name
    print(json.dumps({"cuts": len(HELD) + RANDOM_CUTS, "final": current}))
