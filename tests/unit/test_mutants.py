"""./scripts/mutants itself, on a tiny module of its own: it plants, runs the module's test, and reports a kill and
the survivors (file:line and the mutation); an explained survivor counts as equivalent."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tests.checkout import REPO

TINY = '''\
def within(value: int, limit: int) -> bool:
    return value <= limit


def label(value: int) -> str:
    if value > 100:
        return "big"
    return "small"
'''
TEST = '''\
from tiny import within


def test_within() -> None:
    assert within(3, 3) and not within(4, 3)
'''


def _project(root: Path, allowed: str = "") -> None:
    root.mkdir()
    (root / "tiny.py").write_text(TINY)
    (root / "test_tiny.py").write_text(TEST)
    (root / "targets.toml").write_text('[[target]]\npath = "tiny.py"\ntests = ["test_tiny.py"]\n')
    (root / "allow.toml").write_text(allowed)


def _mutants(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "scripts" / "mutation_run.py"), "--root", str(root), "--targets",
                           str(root / "targets.toml"), "--allow", str(root / "allow.toml"), "--jobs", "1", *args],
                          capture_output=True, text=True, timeout=300)


def test_it_lists_the_mutants_it_would_plant(tmp_path: Path) -> None:
    _project(tmp_path / "p")
    listed = _mutants(tmp_path / "p", "--list")
    assert listed.returncode == 0, listed.stderr
    assert "tiny.py:2 [within] boundary: value <= limit -> value < limit" in listed.stdout
    assert "tiny.py:6 [label] constant: if value > 100: -> if value > 101:" in listed.stdout
    assert "tiny.py:7 [label] drop-return: return \"big\" -> pass" in listed.stdout
    assert "5 mutant(s) in 1 module(s)" in listed.stdout


def test_it_reports_the_kill_each_survivor_and_the_explained_one(tmp_path: Path) -> None:
    allowed = textwrap.dedent('''\
        [[equivalent]]
        path = "tiny.py"
        where = "label"
        mutation = "value > 100 -> value >= 100"
        reason = "a test fixture: nothing tells 100 from 101 here"
    ''')
    _project(tmp_path / "p", allowed)
    run = _mutants(tmp_path / "p")
    assert run.returncode == 1, run.stdout + run.stderr  # 1 of 4 counted killed: under the 95% it asks for
    assert "| tiny.py | 5 | 1 | 3 | 1 | 25.0% |" in run.stdout and "3 survivor(s)" in run.stdout
    survivors = run.stdout.split("survivor(s)")[1]
    assert "  tiny.py:6 [label] constant: if value > 100: -> if value > 101:" in survivors
    assert "  tiny.py:7 [label] drop-return" in survivors
    assert "within" not in survivors and "value >= 100" not in survivors  # killed, and explained
    assert (tmp_path / "p" / "tiny.py").read_text() == TINY  # mutants are planted in a copy, never here
