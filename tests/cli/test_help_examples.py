"""Every edgectl command shows examples under --help, and every example parses against its command."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import get_args

import pytest
import typer
from typer import _click
from typer._click.core import ParameterSource
from typer.core import TyperArgument, TyperGroup, TyperOption
from typer.testing import CliRunner

from edgectl.cli.help_examples import EXAMPLES, Example, epilog
from edgectl.cli.main import load_commands

ROOT = typer.main.get_command(load_commands())


def _tree(command: _click.Command, path: str = "") -> Iterator[tuple[str, _click.Command]]:
    yield path, command
    if isinstance(command, TyperGroup):
        for name, sub in command.commands.items():
            yield from _tree(sub, f"{path} {name}".strip())


COMMANDS = dict(_tree(ROOT))


class BadExample(Exception):
    """An example that would not run as written."""


def _is_path(param: _click.Parameter) -> bool:
    annotation = param.type_descriptor.annotation if isinstance(param, TyperArgument | TyperOption) else None
    return Path in (annotation, *get_args(annotation))


def _check_values(ctx: _click.Context, example: Example) -> None:
    """Parsed leniently (a path need not exist here): a given value must convert, a required one be given."""
    for param in ctx.command.params:
        if not param.expose_value:  # --help, --show-completion: eager, they exit
            continue
        name = param.name or ""
        given = ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE
        if given and ctx.params.get(name) is None and not _is_path(param):
            raise BadExample(f"{example.line!r}: the value of {param.opts} does not convert")
        if param.required and not given:
            raise BadExample(f"{example.line!r}: the required {param.opts} is missing")


def command_path(example: Example) -> str:
    """The command an example runs, after checking its options and values against that command's."""
    argv = shlex.split(example.line)
    assert argv[0] == "edgectl", example.line
    command: _click.Command = ROOT
    ctx = ROOT.make_context("edgectl", argv[1:], resilient_parsing=True)
    path: list[str] = []
    while True:
        _check_values(ctx, example)
        rest = [*ctx._protected_args, *ctx.args]
        if not isinstance(command, TyperGroup) or not rest:
            break
        name, sub, args = command.resolve_command(ctx, rest)
        if sub is None or name is None:
            raise BadExample(f"{example.line!r}: no command {rest[0]!r} under {' '.join(['edgectl', *path])!r}")
        command, ctx = sub, sub.make_context(name, args, parent=ctx, resilient_parsing=True)
        path.append(name)
    if rest:
        raise BadExample(f"{example.line!r}: unexpected arguments {rest}")
    return " ".join(path)


def test_every_command_has_examples_in_its_help_epilog() -> None:
    missing = [path or "edgectl" for path in COMMANDS if not EXAMPLES.get(path)]
    assert not missing, f"add examples to edgectl/cli/help_examples.py for: {', '.join(missing)}"
    assert all(command.epilog == epilog(EXAMPLES[path]) for path, command in COMMANDS.items())


def test_the_registry_names_only_commands_that_exist() -> None:
    assert not set(EXAMPLES) - set(COMMANDS), "examples for commands that do not exist"


@pytest.mark.parametrize("path", sorted(EXAMPLES))
def test_each_example_runs_its_own_command_with_options_it_has(path: str) -> None:
    for example in EXAMPLES[path]:
        ran = command_path(example)
        assert ran == path or ran.startswith(f"{path} ".lstrip()), f"{example.line!r} runs {ran!r}, not {path!r}"
        assert example.says and "[" not in example.line + example.says  # rich would read [..] as markup


@pytest.mark.parametrize("line", [
    "edgectl rollout status r-1 --no-such-option",  # an option the command does not have
    "edgectl rollout stauts r-1",  # a command that does not exist
    "edgectl rollout status",  # a required argument missing
    "edgectl rollout status r-1 r-2",  # one argument too many
    "edgectl build model.onnx --name m --version three",  # a value that does not convert
    "edgectl deploy m.edgepkg --fleet",  # an option without its value
])
def test_a_broken_example_is_caught(line: str) -> None:
    with pytest.raises((_click.ClickException, BadExample)):
        command_path(Example(line, "broken"))


def test_help_shows_the_examples_as_written() -> None:
    runner = CliRunner()
    for path in ("", "rollout", "rollout status", "deploy"):  # root, group, leaf, quoted argument
        result = runner.invoke(load_commands(), [*path.split(), "--help"], prog_name="edgectl",
                               env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output
        assert "Examples:" in result.output
        for example in EXAMPLES[path]:
            assert f"$ {example.line}" in result.output and example.says in result.output
