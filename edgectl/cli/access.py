"""``edgectl users add|list|remove``, ``edgectl tokens create|list|revoke`` and ``edgectl api serve``.

Users and tokens live in the controller store; changes made here are audited as ``cli:<login>``.
"""

from __future__ import annotations

import contextlib
import getpass
import signal
import threading
import time

import typer

from edgecore.errors import UserError
from edgectl.api.accounts import Accounts, parse_role
from edgectl.cli.app import app, options
from edgectl.cli.output import console, print_json, print_table
from edgectl.config import load_edgectl_config
from edgectl.controller.gates import parse_duration
from edgectl.fleet import open_store

users_app = typer.Typer(help="People and scripts that may use the REST API, with a role each.", no_args_is_help=True)
tokens_app = typer.Typer(help="Bearer tokens for the REST API (only their hashes are stored).", no_args_is_help=True)
api_app = typer.Typer(help="The REST API (/api/v1), /metrics and the web console.", no_args_is_help=True)
app.add_typer(users_app, name="users")
app.add_typer(tokens_app, name="tokens")
app.add_typer(api_app, name="api")

JSON = typer.Option(False, "--json", help="Print JSON.")


def _accounts(ctx: typer.Context) -> Accounts:
    return Accounts(open_store(load_edgectl_config(options(ctx).config), must_exist=False))


def _actor() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):
        return "cli"


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts)) if ts else "-"


@users_app.command("add")
def users_add(ctx: typer.Context, name: str = typer.Argument(..., help="User name."),
              role: str = typer.Option(..., "--role", help="viewer (read), operator (also deploy and steer), admin (also users "
                                       "and tokens)."),
              as_json: bool = JSON) -> None:
    """Add a user with a role; then give it a token with `edgectl tokens create NAME`."""
    user = _accounts(ctx).add_user(name, parse_role(role), _actor())
    if as_json:
        print_json(user.to_dict())
    else:
        console.print(f"user {user.name} added as {user.role}; `edgectl tokens create {user.name}` gives it a token")


@users_app.command("list")
def users_list(ctx: typer.Context, as_json: bool = JSON) -> None:
    """List users and their roles."""
    users = _accounts(ctx).users()
    if as_json:
        print_json([u.to_dict() for u in users])
        return
    print_table("users", ["NAME", "ROLE", "CREATED"], [(u.name, u.role, _when(u.created)) for u in users])


@users_app.command("remove")
def users_remove(ctx: typer.Context, name: str = typer.Argument(..., help="User name."), as_json: bool = JSON) -> None:
    """Remove a user; its tokens stop working at once."""
    _accounts(ctx).remove_user(name, _actor())
    if as_json:
        print_json({"removed": name})
    else:
        console.print(f"user {name} removed; its tokens are revoked")


@tokens_app.command("create")
def tokens_create(ctx: typer.Context, user: str = typer.Argument(..., help="The user the token acts as."),
                  name: str = typer.Option("", "--name", help="What the token is for (e.g. grafana, ci)."),
                  expires: str | None = typer.Option(None, "--expires", help="Lifetime, e.g. 90d, 12h or 30m; default: none."),
                  as_json: bool = JSON) -> None:
    """Create a token; it is printed once and never stored (only its SHA-256 is)."""
    row, token = _accounts(ctx).create_token(user, name, _lifetime(expires), _actor())
    if as_json:
        print_json({**row.to_dict(), "token": token})
        return
    # Only the token on stdout, so that `edgectl tokens create NAME > file` writes a credentials file as it is.
    typer.echo(f"token {row.id} for {user} (expires {_when(row.expires)}); it is shown only now:", err=True)
    typer.echo(token)


def _lifetime(text: str | None) -> float | None:
    if text is None:
        return None
    if text.strip().endswith("d"):
        days = text.strip()[:-1]
        try:
            return float(days) * 86400.0
        except ValueError:
            raise UserError(f"--expires {text!r}: expected a duration such as 90d, 12h or 30m") from None
    return parse_duration(text, "--expires")


@tokens_app.command("list")
def tokens_list(ctx: typer.Context, user: str | None = typer.Option(None, "--user", help="Only this user's tokens."),
                as_json: bool = JSON) -> None:
    """List tokens: id, user, name, created, expiry, revocation (never the token)."""
    tokens = _accounts(ctx).tokens(user)
    if as_json:
        print_json([t.to_dict() for t in tokens])
        return
    print_table("tokens", ["ID", "USER", "NAME", "CREATED", "EXPIRES", "REVOKED"],
                [(t.id, t.user, t.name, _when(t.created), _when(t.expires), _when(t.revoked)) for t in tokens])


@tokens_app.command("revoke")
def tokens_revoke(ctx: typer.Context, token_id: str = typer.Argument(..., help="Token id (see `edgectl tokens list`)."),
                  as_json: bool = JSON) -> None:
    """Revoke a token; requests with it get 401 from now on."""
    _accounts(ctx).revoke_token(token_id, _actor())
    if as_json:
        print_json({"revoked": token_id})
    else:
        console.print(f"token {token_id} revoked")


@api_app.command("serve")
def api_serve(ctx: typer.Context,
              http: str | None = typer.Option(None, "--http", help="HOST:PORT to listen on (default: api.listen, "
                                              "127.0.0.1:8470).")) -> None:
    """Serve the REST API, /metrics and the console on the store alone (no broker), until SIGTERM/Ctrl-C.

    `edgectl controller run --http ADDR` serves the same from the controller process."""
    from edgectl.api import start_api

    config = load_edgectl_config(options(ctx).config)
    store = open_store(config, must_exist=False)
    server = start_api(store, config, http)
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    console.print(f"api: {server.url}/api/v1 (console {server.url}/console/), store {store.location()}")
    with contextlib.suppress(KeyboardInterrupt):
        while not stopped.wait(1.0):
            pass
    server.stop()
