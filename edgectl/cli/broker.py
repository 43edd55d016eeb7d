"""``edgectl broker``: run the embedded broker; subcommands generate broker configuration."""

from __future__ import annotations

import typer

from edgectl.cli.app import app
from edgectl.embedded_broker import run_embedded_broker

broker_app = typer.Typer(
    help="Run the embedded MQTT broker in the foreground (for demos and one-machine trials).",
    invoke_without_command=True,
    no_args_is_help=False,
)
app.add_typer(broker_app, name="broker")


@broker_app.callback()
def broker(
    ctx: typer.Context,
    host: str = typer.Option("127.0.0.1", help="Address to listen on."),
    port: int = typer.Option(1883, help="TCP port to listen on."),
    register: bool = typer.Option(
        True, help="Record the URL in $EDGECTL_HOME so other edgectl commands find this broker."
    ),
) -> None:
    """Run the embedded amqtt broker (MQTT 3.1.1, anonymous, plaintext) until Ctrl-C."""
    if ctx.invoked_subcommand is not None:
        return
    typer.echo(f"embedded broker on mqtt://{host}:{port} (Ctrl-C to stop)", err=True)
    run_embedded_broker(host, port, register=register)
