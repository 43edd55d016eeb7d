"""The typer application that every command module attaches its commands to."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import typer

from edgecore import __version__
from edgectl.cli.help_examples import ExamplesGroup

app = typer.Typer(
    name="edgectl",
    help=(
        "Take ONNX models from this workstation to fleets of edge devices.\n\n"
        "Exit codes: 0 ok, 2 bad input (model, package, config, arguments), 3 verification "
        "failed, 4 broker unreachable, 5 operation ran but failed, 1 internal error, "
        "130 interrupted."
    ),
    no_args_is_help=True,
    cls=ExamplesGroup,  # puts each command's examples under its --help
    pretty_exceptions_enable=False,
)


@dataclass(frozen=True)
class GlobalOptions:
    """Options given before the command name, available to every command."""

    config: Path | None
    broker: str | None  # one URL, or a cluster's nodes separated by commas
    debug: bool


def _version(value: bool) -> None:
    if value:
        typer.echo(f"edgectl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    config: Path | None = typer.Option(
        None, "--config", "-c", envvar="EDGECTL_CONFIG",
        help="edgectl.yaml to use (default: ./edgectl.yaml, then ~/.config/edgectl/edgectl.yaml).",
    ),
    broker: list[str] | None = typer.Option(
        None, "--broker", envvar="EDGECTL_BROKER",
        help="Broker URL, e.g. mqtt://host:1883 or mqtts://host:8883; for a cluster, repeat it or separate "
        "the nodes' URLs with commas (tried in order, failover on loss). Default: the config, "
        "else the embedded broker started by `edgectl broker` or ./scripts/demo.",
    ),
    debug: bool = typer.Option(False, "--debug", help="Print tracebacks and debug logs."),
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    ctx.obj = GlobalOptions(config=config, broker=",".join(broker) if broker else None, debug=debug)


def options(ctx: typer.Context) -> GlobalOptions:
    """The global options of the running command."""
    obj = ctx.find_root().obj
    assert isinstance(obj, GlobalOptions)
    return obj
