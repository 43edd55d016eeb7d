"""./scripts/test-arm64's pieces, quickly: the wheel it installs, and its trial run against a lean venv on x86.

The full run (debootstrap, pip and the agent under qemu) takes from 8 minutes to an hour; its figures are in
docs/benchmarks.md. Here the same trial driver (scripts/device_trial.py) runs against a venv holding
only the agent extra, which is what the arm64 root file system gets from its aarch64 wheels.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from targets.profile import BUILTIN_DIR
from tests.checkout import REPO
from tests.devices.lean import lean_venv

sys.path.insert(0, str(REPO / "scripts"))
from device_trial import Exchange, ProcessLauncher, answers_match, trial


def test_the_script_parses_and_names_its_debian_pieces() -> None:
    script = (REPO / "scripts" / "test-arm64").read_text()
    subprocess.run(["bash", "-n", str(REPO / "scripts" / "test-arm64")], check=True)
    for piece in ("debootstrap --foreign --arch=arm64", "--second-stage", "qemu-aarch64-static",
                  "manylinux_2_${minor}_aarch64", "--only-binary=:all:", "[agent]", "scripts/device_trial.py"):
        assert piece in script, piece


def test_the_wheel_carries_the_profiles_and_the_agent_command(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(REPO), "-w",
                    str(tmp_path)], check=True, cwd=tmp_path)
    wheel = next(tmp_path.glob("edgectl-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = next(archive.read(n).decode() for n in names if n.endswith("entry_points.txt"))
    shipped = {Path(n).name for n in names if "/data/share/edgectl/targets/" in n}
    assert {p.name for p in BUILTIN_DIR.glob("*.yaml")} <= shipped
    assert "edge-agent = agent.cli.main:main" in entry_points


def test_answers_differing_beyond_float_tolerance_fail() -> None:
    want = np.linspace(0, 1, 10, dtype=np.float32)
    assert answers_match(want + 1e-7, want)[0]
    assert not answers_match(want + 1e-2, want)[0]
    assert not answers_match(want[:5], want[:5].reshape(1, 5))[0]


@pytest.mark.slow
def test_the_trial_probes_deploys_and_compares_on_a_lean_agent(tmp_path: Path) -> None:
    python = lean_venv(tmp_path / "venv")
    exchange = Exchange(tmp_path / "exchange", tmp_path / "exchange")
    exchange.host.mkdir()
    figures = trial([str(python)], exchange, ProcessLauncher([str(python)], exchange), timeout_s=240,
                    progress=lambda step: None)
    assert figures["match"] is True and figures["max_abs_diff"] < 1e-4
    assert figures["arch"] == "x86_64" and "openvino" not in figures["runtimes"]
    assert figures["probe_backend"].startswith("onnxruntime/") and "cpu-x86" in figures["ready_profiles"]
    assert figures["deploy_s"] > 0 and figures["first_inference_ms"] > 0
