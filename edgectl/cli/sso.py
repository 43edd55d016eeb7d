"""``edgectl sso check``: what the controller makes of a JWT from the single sign-on provider (docs/sso.md).

It reads ``api.oidc`` from the same configuration as ``controller run`` and checks the token as the API would
(signature from the provider's JWKS, issuer, audience, times, roles claim), so an admin sees a role mapping work
before anyone signs in, and a script learns why its token would be refused.
"""

from __future__ import annotations

import sys
import time

import typer

from edgecore.errors import OperationFailed, UserError, VerificationError
from edgectl.api.oidc import sso_from_settings
from edgectl.api.router import ApiError
from edgectl.cli.app import app, options
from edgectl.cli.output import console, print_json
from edgectl.config import load_edgectl_config

sso_app = typer.Typer(help="Single sign-on with an OpenID Connect provider (api.oidc, docs/sso.md).", no_args_is_help=True)
app.add_typer(sso_app, name="sso")


@sso_app.command("check")
def sso_check(ctx: typer.Context,
              token: str = typer.Argument("-", help="The JWT; '-' (the default) reads it from standard input."),
              as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Check a JWT as the API would: the user and role it signs in as, or why it is refused."""
    sso = sso_from_settings(load_edgectl_config(options(ctx).config).api.oidc)
    if sso is None:
        raise UserError("single sign-on is off: set api.oidc.issuer, client_id and role_map (docs/sso.md)")
    text = sys.stdin.read().strip() if token == "-" else token.strip()
    try:
        claims = sso.verify(text)
        principal = sso.principal(claims)
    except ApiError as exc:  # refused (401, 403), or the provider cannot be used (503)
        raise (VerificationError if exc.status < 500 else OperationFailed)(exc.message) from None
    expires = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(claims["exp"]))
    if as_json:
        print_json({"user": principal.user, "role": principal.role.value, "expires": claims["exp"]})
    else:
        console.print(f"{principal.user} signs in as {principal.role} (the token expires {expires})")
