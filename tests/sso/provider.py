"""A real OpenID Connect provider for the single sign-on tests: pyop's Provider behind a small threaded WSGI server.

``python -m tests.sso.provider --port P --cert C --key K --keys keys.json --users users.json --client ID
--secret S --redirect URI`` serves, over HTTPS (pyop takes no other issuer), discovery, ``/authorize`` (a login
form for the test users; PKCE with S256 is required), ``/token`` (client_secret_post) and ``/jwks``. ``keys.json``
is read on every request: ``[{"kid", "pem"}, ...]``, the first signs ID tokens, all are published, so a test
rotates keys by rewriting the file. A user's ``roles`` and ``email`` become claims of the ID tokens issued to
them, beside ``preferred_username``.
"""

from __future__ import annotations

import argparse
import html
import json
import ssl
from collections.abc import Callable, Iterable
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from jwkest.jwk import RSAKey, import_rsa_key
from pyop.authz_state import AuthorizationState
from pyop.exceptions import InvalidAuthenticationRequest, InvalidClientAuthentication, OAuthError
from pyop.provider import Provider
from pyop.subject_identifier import HashBasedSubjectIdentifierFactory
from pyop.userinfo import Userinfo
from pyop.util import should_fragment_encode

__all__ = ["TestProvider", "main"]

StartResponse = Callable[[str, list[tuple[str, str]]], Any]

LOGIN = """<!doctype html><title>Test provider sign-in</title><h1>Test provider</h1>
<form method="post" action="/authorize"><input type="hidden" name="request" value="{request}">
<label>User <input id="username" name="username"></label><label>Password <input id="password" name="password"
type="password"></label><button id="login" type="submit">Sign in</button></form><p id="error">{error}</p>"""

class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True

class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass

def _keys(path: Path) -> list[RSAKey]:
    return [RSAKey(key=import_rsa_key(entry["pem"]), kid=entry["kid"], alg="RS256", use="sig")
            for entry in json.loads(path.read_text())]

class TestProvider:
    """The WSGI app: one pyop Provider, its users and keys."""

    def __init__(self, issuer: str, keys: Path, users: dict[str, dict[str, Any]], client: dict[str, Any]) -> None:
        self.keys, self.users = keys, users
        configuration = {"issuer": issuer, "authorization_endpoint": f"{issuer}/authorize",
                         "token_endpoint": f"{issuer}/token", "jwks_uri": f"{issuer}/jwks",
                         "response_types_supported": ["code"], "subject_types_supported": ["public"],
                         "token_endpoint_auth_methods_supported": ["client_secret_post"],
                         "code_challenge_methods_supported": ["S256"],
                         "scopes_supported": ["openid", "profile", "email"]}
        self.provider = Provider(_keys(keys)[0], configuration, AuthorizationState(HashBasedSubjectIdentifierFactory("t")),
                                 {client["client_id"]: client}, Userinfo({n: {} for n in users}))

    def __call__(self, environ: dict[str, Any], start: StartResponse) -> Iterable[bytes]:
        path, method = environ["PATH_INFO"], environ["REQUEST_METHOD"]
        query = environ.get("QUERY_STRING", "")
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0)).decode() if method == "POST" else ""
        if path == "/.well-known/openid-configuration":
            return _json(start, 200, self.provider.provider_configuration.to_dict())
        if path == "/jwks":
            return _json(start, 200, {"keys": [k.serialize(private=False) for k in _keys(self.keys)]})
        if path == "/authorize" and method == "GET":
            return self._login(start, query, "")
        if path == "/authorize" and method == "POST":
            return self._authorize(start, {k: v[0] for k, v in parse_qs(body).items()})
        if path == "/token" and method == "POST":
            return self._token(start, body, environ)
        return _json(start, 404, {"error": "not_found"})

    def _parse(self, query: str) -> Any:
        request = self.provider.parse_authentication_request(query)
        if request.get("code_challenge_method") != "S256" or not request.get("code_challenge"):
            raise InvalidAuthenticationRequest("PKCE with code_challenge_method=S256 is required", request)
        return request

    def _login(self, start: StartResponse, query: str, error: str) -> Iterable[bytes]:
        try:
            self._parse(query)
        except OAuthError as exc:
            return _json(start, 400, {"error": "invalid_request", "error_description": str(exc)})
        page = LOGIN.format(request=html.escape(query), error=html.escape(error))
        start("200 OK", [("Content-Type", "text/html; charset=utf-8")])
        return [page.encode()]

    def _authorize(self, start: StartResponse, form: dict[str, str]) -> Iterable[bytes]:
        query = form.get("request", "")
        user = self.users.get(form.get("username", ""))
        if user is None or user["password"] != form.get("password"):
            return self._login(start, query, "wrong user or password")
        request = self._parse(query)
        response = self.provider.authorize(request, form["username"])
        start("302 Found", [("Location", response.request(request["redirect_uri"], should_fragment_encode(request)))])
        return [b""]

    def _token(self, start: StartResponse, body: str, environ: dict[str, Any]) -> Iterable[bytes]:
        self.provider.signing_key = _keys(self.keys)[0]  # the key file's first key signs (a test may have rotated)
        try:
            answer = self.provider.handle_token_request(body, {"Authorization": environ.get("HTTP_AUTHORIZATION")}
                                                        if environ.get("HTTP_AUTHORIZATION") else {},
                                                        extra_id_token_claims=self._claims)
        except InvalidClientAuthentication as exc:
            return _json(start, 401, {"error": "invalid_client", "error_description": str(exc)})
        except OAuthError as exc:
            return _json(start, 400, {"error": exc.oauth_error, "error_description": str(exc)})
        return _json(start, 200, answer.to_dict())

    def _claims(self, user_id: str, _client_id: str) -> dict[str, Any]:
        user = self.users[user_id]
        return {"preferred_username": user_id, **{k: user[k] for k in ("roles", "email") if k in user}}

def _json(start: StartResponse, status: int, data: Any) -> Iterable[bytes]:
    reasons = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found"}
    start(f"{status} {reasons[status]}", [("Content-Type", "application/json"), ("Cache-Control", "no-store")])
    return [json.dumps(data).encode()]

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--keys", type=Path, required=True)
    parser.add_argument("--users", type=Path, required=True)
    parser.add_argument("--client", required=True)
    parser.add_argument("--secret", required=True)
    parser.add_argument("--redirect", action="append", required=True)
    args = parser.parse_args()
    issuer = f"https://127.0.0.1:{args.port}"
    client = {"client_id": args.client, "client_secret": args.secret, "redirect_uris": args.redirect,
              "response_types": ["code"], "token_endpoint_auth_method": "client_secret_post"}
    app = TestProvider(issuer, args.keys, json.loads(args.users.read_text()), client)
    server = make_server("127.0.0.1", args.port, app, _Server, _QuietHandler)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(args.cert, args.key)
    server.socket = tls.wrap_socket(server.socket, server_side=True)
    server.serve_forever()

if __name__ == "__main__":
    main()
