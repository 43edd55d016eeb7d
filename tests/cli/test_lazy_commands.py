"""``edgectl CMD`` imports only the command modules CMD needs: the table must name, for each top-level command,
modules that attach the whole tree under it, and the command is read from the arguments past the root options."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import typer

from edgectl.cli.main import COMMANDS, MODULES, command_name, host_tools_missing, load_commands
from tests.checkout import checkout_env

_TREE = """
import json, sys, typer
from edgectl.cli.main import load_commands
def tree(command, path):
    yield " ".join(path)
    for name, sub in getattr(command, "commands", {}).items():
        yield from tree(sub, [*path, name])
root = typer.main.get_command(load_commands(sys.argv[1:]))
print(json.dumps(sorted(tree(root, []))))
"""


def _tree(args: list[str], **env: str) -> set[str]:
    """The command paths a fresh ``edgectl`` process knows after loading what ``args`` need."""
    done = subprocess.run([sys.executable, "-c", _TREE, *args], capture_output=True, text=True, env=checkout_env(**env),
                          timeout=120, check=True)
    return set(json.loads(done.stdout))


def _under(paths: set[str], name: str) -> set[str]:
    return {p for p in paths if p.split()[:1] == [name]}


def test_the_table_names_every_top_level_command_and_only_those() -> None:
    root = typer.main.get_command(load_commands())
    assert sorted(COMMANDS) == sorted(getattr(root, "commands", {}))
    assert {module for modules in COMMANDS.values() for module in modules} <= set(MODULES)


@pytest.fixture(scope="module")
def everything() -> set[str]:
    return _tree([])


@pytest.mark.parametrize("modules", sorted(set(COMMANDS.values())), ids="+".join)
def test_the_modules_of_a_command_attach_its_whole_tree(modules: tuple[str, ...], everything: set[str]) -> None:
    names = [name for name, needed in COMMANDS.items() if needed == modules]
    loaded = _tree([names[0]])
    for name in names:
        assert _under(loaded, name) == _under(everything, name), name


@pytest.mark.parametrize(("args", "name"), [
    (["deploy", "pkg", "--fleet", "all"], "deploy"),
    (["--config", "edgectl.yaml", "rollout", "list"], "rollout"),
    (["-c", "build", "verify", "p.edgepkg"], "verify"),  # "build" is the value of -c here
    (["--broker", "mqtt://h:1883", "--debug", "devices"], "devices"),
    (["--broker=mqtt://h:1883", "keys", "list"], "keys"),
    (["--help"], None),
    ([], None),
])
def test_the_command_is_read_past_the_root_options(args: list[str], name: str | None) -> None:
    assert command_name(args) == name


def test_a_command_loads_only_its_modules_and_completion_loads_every_one(everything: set[str]) -> None:
    assert _tree(["quantize", "m.onnx"]) == {"", *_under(everything, "quantize")}
    assert _tree(["quantize"], _EDGECTL_COMPLETE="bash_complete") == everything


def test_a_missing_workstation_module_is_named_with_the_extra_to_install() -> None:
    assert host_tools_missing(ModuleNotFoundError("No module named 'yaml'", name="yaml")) is None
    assert host_tools_missing(ModuleNotFoundError("No module named 'x'")) is None
    error = host_tools_missing(ModuleNotFoundError("No module named 'jwt.algorithms'", name="jwt.algorithms"))
    # Here every workstation module is installed: the one that failed to import is named.
    assert error is not None and error.exit_code == 2
    assert str(error) == "edgectl needs the workstation tools (jwt not installed): pip install 'edgectl[host]'"
