"""The security commands end to end, as a person runs them: exit codes, files, messages."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml


def _edgectl(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EDGECTL_HOME": str(home)}
    env.pop("EDGECTL_PKI", None)
    return subprocess.run(
        [sys.executable, "-m", "edgectl.cli.main", *args], env=env, capture_output=True, text=True, timeout=60
    )


def test_init_enroll_config_revoke(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert _edgectl(home, "pki", "init").returncode == 0
    assert (home / "pki" / "controller.pem").exists()

    again = _edgectl(home, "pki", "init", "--algorithm", "ed25519")
    assert again.returncode == 2 and again.stderr.startswith("error: a fleet CA already exists")

    out = tmp_path / "cam-1"
    enroll = _edgectl(home, "device", "enroll", "cam-1", "--tags", "site=lyon", "--broker-url", "mqtts://b.lan:8883",
                      "--out", str(out))
    assert enroll.returncode == 0, enroll.stderr
    assert yaml.safe_load((out / "agent.yaml").read_text())["tags"] == {"site": "lyon"}

    broker = _edgectl(home, "broker", "config", "--out", str(tmp_path / "broker"), "--port", "8884", "--host", "b.lan")
    assert broker.returncode == 0, broker.stderr
    conf = (tmp_path / "broker" / "mosquitto.conf").read_text()
    for line in ("listener 8884", "require_certificate true", "use_identity_as_username true", "allow_anonymous false",
                 f"crlfile {(tmp_path / 'broker' / 'crl.pem').resolve()}"):
        assert line in conf.splitlines()

    before = (tmp_path / "broker" / "crl.pem").read_bytes()
    assert _edgectl(home, "device", "revoke", "cam-1").returncode == 0
    assert (tmp_path / "broker" / "crl.pem").read_bytes() != before


def test_errors_are_one_line_with_exit_code_2(tmp_path: Path) -> None:
    no_pki = _edgectl(tmp_path, "device", "enroll", "cam-1", "--out", str(tmp_path / "x"))
    assert no_pki.returncode == 2 and no_pki.stderr == f"error: no fleet CA in {tmp_path / 'pki'}: run `edgectl pki init` first\n"
    assert _edgectl(tmp_path, "pki", "init").returncode == 0
    reserved = _edgectl(tmp_path, "device", "enroll", "controller", "--out", str(tmp_path / "x"))
    assert reserved.returncode == 2 and "reserved" in reserved.stderr
