"""The package layers (docs/code-style.md): each package imports only the packages below it.

    edgectl ──► quantize ──► targets ──► edgecore ◄── agent

``edgecore`` imports none of ours; ``agent`` (the device daemon) imports only ``edgecore``, and no
host package imports ``agent``. Every import statement counts, including those inside functions.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OURS = ("agent", "edgecore", "edgectl", "quantize", "targets")
ALLOWED: dict[str, frozenset[str]] = {
    "edgecore": frozenset({"edgecore"}),
    "agent": frozenset({"agent", "edgecore"}),
    "targets": frozenset({"targets", "edgecore"}),
    "quantize": frozenset({"quantize", "targets", "edgecore"}),
    "edgectl": frozenset({"edgectl", "quantize", "targets", "edgecore"}),
}


def imported_packages(source: str) -> set[tuple[int, str]]:
    """(line, top-level package) for every absolute import of one of our packages in ``source``."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found |= {(node.lineno, name.split(".")[0]) for name in names if name.split(".")[0] in OURS}
    return found


def violations(package: str, root: Path = ROOT) -> list[str]:
    """Every import in ``package`` that crosses a layer it may not cross, as ``file:line imports X``."""
    bad = []
    for path in sorted((root / package).rglob("*.py")):
        for line, imported in sorted(imported_packages(path.read_text())):
            if imported not in ALLOWED[package]:
                bad.append(f"{path.relative_to(root)}:{line} imports {imported}")
    return bad


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_its_lower_layers(package: str) -> None:
    assert violations(package) == []


def test_the_checker_sees_imports_inside_functions_and_from_forms() -> None:
    source = "import agent.daemon\nfrom edgectl.cli import main\ndef f():\n    from quantize import passes\n"
    assert imported_packages(source) == {(1, "agent"), (2, "edgectl"), (4, "quantize")}


def test_a_planted_edge_is_reported(tmp_path: Path) -> None:
    # The check must be able to fail: a core module importing the daemon is reported by file and line.
    (tmp_path / "edgecore" / "protocol").mkdir(parents=True)
    (tmp_path / "edgecore" / "protocol" / "planted.py").write_text('"""planted"""\n\nfrom agent.daemon import Agent\n')
    (tmp_path / "edgecore" / "fine.py").write_text("from edgecore.errors import EdgeError\n")
    assert violations("edgecore", tmp_path) == ["edgecore/protocol/planted.py:3 imports agent"]
