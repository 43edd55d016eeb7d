"""The typer application of ``edge-agent``; command modules attach their commands to it."""

from __future__ import annotations

import typer

from agent import __version__

app = typer.Typer(
    name="edge-agent",
    help=(
        "The edgectl device agent: fetches signed models over MQTT, installs them atomically, "
        "picks the fastest backend by measuring it, serves local inference and reports telemetry.\n\n"
        "Exit codes: 0 ok, 2 bad input or config, 3 verification failed, 4 broker unreachable, "
        "5 operation failed, 1 internal error."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"edge-agent {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """edge-agent: the device daemon."""
