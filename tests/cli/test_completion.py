"""Shell completion of ``edgectl`` (typer's): the bash script, its install, and the completion protocol."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from edgectl.cli.main import load_commands
from edgectl.config import load_edgectl_config
from tests.checkout import checkout_env

# Sourced by bash: asks the completion function what follows `edgectl rol`, as the shell does on Tab.
COMPLETE_ROL = 'COMP_WORDS=(edgectl rol); COMP_CWORD=1; _edgectl_completion edgectl; printf "%s\\n" "${COMPREPLY[@]}"'


def _on_path(tmp_path: Path) -> dict[str, str]:
    """An environment whose PATH finds this checkout's `edgectl` first and whose HOME is ``tmp_path``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    launcher = bin_dir / "edgectl"
    launcher.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m edgectl.cli.main "$@"\n')
    launcher.chmod(0o755)
    return checkout_env(PATH=f"{bin_dir}:/usr/bin:/bin", HOME=str(tmp_path))


def _bash(script: str, env: dict[str, str]) -> str:
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("bash is not installed")
    done = subprocess.run([bash, "-c", script], env=env, capture_output=True, text=True, timeout=60, check=True)
    return done.stdout


def test_the_bash_script_shown_and_installed_completes_a_command_name(tmp_path: Path) -> None:
    env = _on_path(tmp_path)
    result = CliRunner().invoke(load_commands(), ["--show-completion", "bash"], prog_name="edgectl")
    assert result.exit_code == 0, result.output
    shown = result.output
    assert "complete -o default -F _edgectl_completion edgectl" in shown
    assert "_EDGECTL_COMPLETE=complete_bash" in shown
    subprocess.run(["edgectl", "--install-completion", "bash"], env=env, capture_output=True, timeout=60, check=True)
    assert (tmp_path / ".bash_completions" / "edgectl.sh").read_text().strip() == shown.strip()
    assert _bash(f'source "$HOME/.bashrc"; {COMPLETE_ROL}', env).split() == ["rollout"]


@pytest.mark.parametrize(("words", "expected"), [
    ("edgectl rol", {"rollout"}),
    ("edgectl rollout re", {"reject", "resume", "retry-failed"}),
    ("edgectl rollout status --", {"--follow", "--json", "--help"}),
    ("edgectl --br", {"--broker"}),
])
def test_the_completion_protocol_completes_commands_and_options(words: str, expected: set[str]) -> None:
    env = {"_EDGECTL_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(len(words.split()) - 1)}
    result = CliRunner().invoke(load_commands(), [], prog_name="edgectl", env=env)
    assert result.exit_code == 0, result.output
    assert set(result.output.split()) == expected


def test_the_completion_variable_is_not_read_as_a_configuration_key(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    # `_EDGECTL_COMPLETE` does not start with the EDGECTL_ prefix of configuration keys: an unknown key fails a command.
    monkeypatch.chdir(tmp_path)  # no ./edgectl.yaml
    without = load_edgectl_config(None)
    monkeypatch.setenv("_EDGECTL_COMPLETE", "complete_bash")
    assert load_edgectl_config(None) == without
