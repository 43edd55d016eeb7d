"""The device-side runner refuses tampered manifests and runs pieces in order."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import targets
from edgecore.errors import ModelError
from edgecore.partitions import PartitionedRunner, load_plan
from targets.partitioner import write_partitions
from tests.targets import graphs


@pytest.fixture
def plan_dir(tmp_path: Path) -> Path:
    model = graphs.unsupported_in_middle()
    write_partitions(model, targets.analyse(model, targets.load_profile("nnapi")), tmp_path)
    return tmp_path


def test_runner_reports_fallbacks_and_needs_every_input(plan_dir: Path) -> None:
    with PartitionedRunner(load_plan(plan_dir), available=["CPUExecutionProvider"]) as runner:
        assert len(runner.fallbacks) == 2
        assert runner.run({"x": np.ones((2, 8), np.float32)})["y"].shape == (2, 4)
        with pytest.raises(ModelError, match="missing input 'x'"):
            runner.run({})


@pytest.mark.parametrize("tamper", ["hash", "path", "format"])
def test_tampered_manifest_is_refused(plan_dir: Path, tamper: str) -> None:
    path = plan_dir / "partitions.json"
    manifest = json.loads(path.read_text())
    if tamper == "hash":
        (plan_dir / manifest["pieces"][0]["file"]).write_bytes(b"changed")
    elif tamper == "path":
        manifest["pieces"][0]["file"] = "../elsewhere.onnx"
    else:
        manifest["format"] = "something/2"
    path.write_text(json.dumps(manifest))
    with pytest.raises(ModelError):
        load_plan(plan_dir)
