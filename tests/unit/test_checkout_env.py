"""Subprocesses started by the test helpers import this checkout's code, not another copy on the path."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.checkout import REPO, checkout_env
from tests.fleet import AgentProcess, EdgectlHome

WHERE = "import agent, edgectl; print(agent.__file__); print(edgectl.__file__)"


@pytest.fixture
def decoy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Another 'checkout' first on this process's PYTHONPATH, as a second copy of the project would be."""
    root = tmp_path / "other-checkout"
    for package in ("agent", "edgectl"):
        (root / package).mkdir(parents=True)
        (root / package / "__init__.py").write_text("raise SystemExit('imported the other checkout')\n")
    monkeypatch.setenv("PYTHONPATH", str(root))
    return root


def imported_from(env: dict[str, str], cwd: Path) -> list[Path]:
    done = subprocess.run([sys.executable, "-c", WHERE], env=env, cwd=cwd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return [Path(line) for line in done.stdout.splitlines()]


def test_the_decoy_wins_without_the_pin(decoy: Path, tmp_path: Path) -> None:
    """The check below can fail: an environment without the pin imports the other checkout."""
    done = subprocess.run([sys.executable, "-c", WHERE], env=dict(os.environ), cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode != 0 and "imported the other checkout" in done.stderr


def test_checkout_env_puts_this_checkout_first_and_keeps_the_rest(decoy: Path, tmp_path: Path) -> None:
    env = checkout_env(EXTRA="1")
    assert env["PYTHONPATH"].split(os.pathsep) == [str(REPO), str(decoy)] and env["EXTRA"] == "1"
    assert checkout_env(env)["PYTHONPATH"] == env["PYTHONPATH"]  # pinning twice does not grow the path
    assert all(path.is_relative_to(REPO) for path in imported_from(env, tmp_path))


def test_helpers_start_subprocesses_on_this_checkout(decoy: Path, tmp_path: Path) -> None:
    home = EdgectlHome(tmp_path / "home", "mqtt://127.0.0.1:1")
    home.path.mkdir()
    agent = AgentProcess("dev-1", tmp_path / "agent", "mqtt://127.0.0.1:1", [], [], env_extra={"X": "1"})
    for env in (home.env(), agent.env()):
        assert all(path.is_relative_to(REPO) for path in imported_from(env, tmp_path))


def test_subprocesses_started_without_an_env_of_their_own_are_pinned_too(tmp_path: Path) -> None:
    """tests/conftest.py pins this process's PYTHONPATH, which a plain subprocess.run inherits."""
    assert os.environ["PYTHONPATH"].split(os.pathsep)[0] == str(REPO)
    assert all(path.is_relative_to(REPO) for path in imported_from(dict(os.environ), tmp_path))
