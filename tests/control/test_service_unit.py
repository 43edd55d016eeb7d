"""The controller's systemd unit (issue 27.7): restarted on failure, bounded in descriptors and memory, hardened as
the agent's unit is, and its ExecStart a command line `edgectl` takes."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edgectl.api.server import parse_listen
from edgectl.config import ApiSettings
from edgectl.controller.inbox import InboxLimits
from tests.checkout import REPO, checkout_env

UNIT = REPO / "configs" / "systemd" / "edgectl-controller.service"
AGENT_UNIT = REPO / "configs" / "systemd" / "edge-agent.service"
HARDENING = ("NoNewPrivileges", "ProtectSystem", "ProtectHome", "PrivateTmp")
SIZES = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def _keys(path: Path) -> dict[str, list[str]]:
    """``Section.Key`` -> its values, in order (systemd allows a key more than once)."""
    found: dict[str, list[str]] = {}
    section = ""
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        found.setdefault(f"{section}.{key.strip()}", []).append(value.strip())
    return found


def _one(keys: dict[str, list[str]], key: str) -> str:
    values = keys.get(key, [])
    assert len(values) == 1, f"{key}: {values}"
    return values[0]


def test_the_unit_restarts_the_controller_and_bounds_it() -> None:
    keys = _keys(UNIT)
    assert _one(keys, "Service.Restart") == "on-failure"
    assert float(_one(keys, "Service.RestartSec")) > 0
    assert _one(keys, "Service.KillSignal") == "SIGTERM"  # a clean stop gives the engine lease up at once
    nofile = int(_one(keys, "Service.LimitNOFILE"))
    assert nofile >= 2 * ApiSettings().max_connections, "fewer descriptors than the API's connections need"
    memory = re.fullmatch(r"(\d+)([KMG])", _one(keys, "Service.MemoryMax"))
    assert memory is not None, "MemoryMax is a size (K, M or G)"
    assert int(memory[1]) * SIZES[memory[2]] >= 4 * InboxLimits().budget_bytes, "less than the ingest buffer needs"
    agent = _keys(AGENT_UNIT)
    for key in HARDENING:  # the agent's hardening, kept
        assert _one(keys, f"Service.{key}") == _one(agent, f"Service.{key}"), key
    home = next(v.split("=", 1)[1] for v in keys["Service.Environment"] if v.startswith("EDGECTL_HOME="))
    assert home in keys["Service.ReadWritePaths"] and home == f"/var/lib/{_one(keys, 'Service.StateDirectory')}"
    assert _one(keys, "Install.WantedBy") == "multi-user.target"


def test_execstart_is_a_controller_run_command_line_edgectl_takes(tmp_path: Path) -> None:
    argv = shlex.split(_one(_keys(UNIT), "Service.ExecStart"))
    assert Path(argv[0]).name == "edgectl" and Path(argv[0]).is_absolute()
    assert argv[argv.index("controller"):argv.index("controller") + 2] == ["controller", "run"]
    parse_listen(argv[argv.index("--http") + 1])  # raises on a listen address the API refuses
    shown = subprocess.run([sys.executable, "-m", "edgectl.cli.main", *argv[1:], "--help"], capture_output=True, text=True,
                           env=checkout_env(EDGECTL_HOME=str(tmp_path)), cwd=tmp_path, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "Usage: edgectl controller run" in " ".join(shown.stdout.split())


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed (Debian's systemd)")
def test_systemd_reads_the_unit_without_a_warning(tmp_path: Path) -> None:
    """``systemd-analyze verify``: unknown keys, keys in the wrong section, bad values. The program is checked to be
    executable, so the copy names this checkout's ``edgectl`` in place of the installed one."""
    program = shlex.split(_one(_keys(UNIT), "Service.ExecStart"))[0]
    here = Path(sys.executable).with_name("edgectl")
    assert here.is_file(), here
    copy = tmp_path / UNIT.name
    copy.write_text(UNIT.read_text().replace(f"ExecStart={program} ", f"ExecStart={here} "))
    verified = subprocess.run(["systemd-analyze", "verify", "--man=no", str(copy)], capture_output=True, text=True, timeout=60)
    said = [line for line in (verified.stdout + verified.stderr).splitlines() if UNIT.name in line]
    assert verified.returncode == 0 and not said, said or verified.stderr
