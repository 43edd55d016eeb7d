"""``/api/v1/sso``: what the console needs to offer single sign-on, and the redemption of its authorization code.

Both are open (the caller has no token yet). The console makes the PKCE verifier, state and nonce in the browser,
checks the state itself, and brings the code here; the controller redeems it at the provider's token endpoint
(with the client secret, when one is set), checks the ID token and its nonce, and hands the token back: the console
then sends it as its bearer token, which the API checks like any other JWT (edgectl.api.oidc).
"""

from __future__ import annotations

from typing import Any

from edgectl.api.context import ApiContext
from edgectl.api.router import ApiError, Request, Response, Route

__all__ = ["SIGN_IN_SCHEMA", "sso_routes"]

_TEXT = {"type": "string", "minLength": 1, "maxLength": 4096}
SIGN_IN_SCHEMA: dict[str, Any] = {
    "type": "object", "additionalProperties": False, "required": ["code", "code_verifier", "redirect_uri", "nonce"],
    "properties": {"code": {**_TEXT, "description": "The authorization code the provider sent back."},
                   "code_verifier": {"type": "string", "minLength": 43, "maxLength": 128,
                                     "description": "PKCE: the secret whose S256 hash the authorization request sent."},
                   "redirect_uri": {**_TEXT, "description": "The redirect_uri the authorization request named."},
                   "nonce": {**_TEXT, "description": "The nonce the authorization request sent; the ID token must carry it."}},
}


def sso_routes(ctx: ApiContext) -> list[Route]:
    def config(_request: Request) -> Response:
        return Response(200, ctx.sso.console_config() if ctx.sso is not None else {"enabled": False})

    def sign_in(request: Request) -> Response:
        if ctx.sso is None:
            raise ApiError(404, "single sign-on is not configured on this controller (api.oidc.issuer, docs/sso.md)")
        body = request.values["body"]
        token, who = ctx.sso.sign_in(body["code"], body["code_verifier"], body["redirect_uri"], body["nonce"])
        ctx.store.audit("signed in", f"{who['user']} as {who['role']} (console, single sign-on)", actor=f"api:{who['user']}")
        return Response(200, {"token": token, **who})

    return [
        Route("GET", "/api/v1/sso", None, "Whether single sign-on is on, and where the console sends the browser.", config,
              responses={200: "enabled, and when true: issuer, client_id, authorization_endpoint, scopes",
                         503: "The provider's discovery document cannot be read"}, tag="meta"),
        Route("POST", "/api/v1/sso/token", None, "Redeem the console's authorization code (PKCE) for a token the API takes.",
              sign_in, body=SIGN_IN_SCHEMA,
              responses={200: "token (the provider's ID token), user, role, expires",
                         400: "Bad body, or the provider refused the code (names it)",
                         401: "The ID token was refused (says why)", 403: "The roles claim maps to no edgectl role",
                         404: "Single sign-on is not configured", 503: "The provider cannot be reached"}, tag="meta"),
    ]
