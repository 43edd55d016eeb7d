"""``edgectl sim``: a simulated fleet in its own process that the registry sees, and clear errors on bad mixes."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from tests.fleet import EdgectlHome, wait_for


def _devices(home: EdgectlHome) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(home.edgectl("devices", "--json", check=True).stdout)
    return rows


def _read_json(proc: subprocess.Popen[str]) -> dict[str, Any]:
    """The indented JSON document a still-running process printed first."""
    assert proc.stdout is not None
    text = ""
    for line in proc.stdout:
        text += line
        if line.rstrip() == "}":
            document: dict[str, Any] = json.loads(text)
            return document
    raise AssertionError(f"no JSON listing before exit: {text!r}")


def test_sim_agents_announce_their_profiles_and_go_offline_on_stop(edgectl_home: EdgectlHome) -> None:
    cmd = [sys.executable, "-m", "edgectl.cli.main", "sim", "--profiles", "jetson-orin:2,nnapi:1", "--fallback", "1",
           "--tag", "group=lab", "--json"]
    sim = subprocess.Popen(cmd, env=edgectl_home.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        listing = _read_json(sim)
        assert listing["connected"] == 3, listing
        assert {a["device_id"]: a["backend"] for a in listing["agents"]}["sim-nnapi-000"] == "onnxruntime/CPUExecutionProvider"
        rows = wait_for(lambda: (r := _devices(edgectl_home)) and len(r) == 3 and all(d["status"] == "online" for d in r) and r,
                        20, "3 simulated devices online")
        assert {d["device_id"]: d["target"] for d in rows} == {
            "sim-jetson-orin-000": "jetson-orin", "sim-jetson-orin-001": "jetson-orin", "sim-nnapi-000": "nnapi"}
        lab = json.loads(edgectl_home.edgectl("devices", "--selector", "group=lab,target=nnapi", "--json", check=True).stdout)
        assert [d["device_id"] for d in lab] == ["sim-nnapi-000"]
    finally:
        sim.terminate()
        assert sim.wait(20) == 0, sim.stderr.read() if sim.stderr else ""
    wait_for(lambda: all(d["status"] == "offline" for d in _devices(edgectl_home)), 20, "simulated devices offline after SIGTERM")


@pytest.mark.parametrize("args, message", [
    (["--profiles", "jetson-orin:2,toaster:1"], "unknown profile 'toaster'"),
    (["--profiles", "nnapi:0"], "'nnapi:0' is not PROFILE:COUNT"),
    (["--agents", "3", "--profiles", "nnapi:2"], "--agents 3 but --profiles adds up to 2"),
    (["--agents", "2", "--latency-factor", "clf@2=fast"], "'clf@2=fast' is not FACTOR"),
    (["--agents", "2", "--agreement", "clf=0.9"], "'clf=0.9' is not FACTOR or NAME@VERSION=FACTOR"),
    (["--agents", "2", "--tag", "lobby"], "'lobby' is not KEY=VALUE"),
    ([], "give --agents N, --profiles"),
    (["--agents", "301"], "one process runs at most 300"),
])
def test_sim_rejects_bad_arguments_with_one_line(edgectl_home: EdgectlHome, args: list[str], message: str) -> None:
    result = edgectl_home.edgectl("sim", *args, "--duration", "1")
    assert result.returncode == 2, result
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
