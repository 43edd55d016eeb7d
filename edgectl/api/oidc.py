"""Single sign-on: an OpenID Connect provider's JWTs as API bearer tokens, and the console's sign-in (docs/sso.md).

:class:`Provider` reads what the issuer publishes: its discovery document (whose ``issuer`` must equal the
configured one exactly) and its JWKS, cached and fetched again on an unknown ``kid`` at most once every
:data:`REFETCH_S`. :class:`Sso` checks a token (an asymmetric signature from that JWKS, ``iss``, ``aud``, ``exp``,
``nbf``, ``iat`` within the leeway), maps its roles claim to an edgectl role and names the caller ``oidc:NAME``; it
also redeems the authorization code the console brings back (PKCE's verifier and the nonce travel with it), so the
client secret, when there is one, stays on the controller. A refused token is a 401 with one line saying why and
``WWW-Authenticate: Bearer error="invalid_token"``; nothing about it is stored.
"""

from __future__ import annotations

import json
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt

from edgecore.errors import ConfigError
from edgectl.api.accounts import Principal
from edgectl.api.router import ApiError
from edgectl.config import OidcSettings
from edgectl.controller.accounts import ROLES, Role

__all__ = ["ALGORITHMS", "REFETCH_S", "Endpoints", "Provider", "Sso", "sso_from_settings"]

# Signatures made with the provider's private key only: "none" and HS* (which a public key could forge) are refused.
ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
_KEY_TYPES = {"RS": "RSA", "PS": "RSA", "ES": "EC", "Ed": "OKP"}
REFETCH_S = 30.0  # an unknown kid fetches the JWKS again at most this often (a stream of made-up kids costs one fetch)
FETCH_TIMEOUT_S = 10.0
MAX_DOCUMENT_BYTES = 1 << 20
SSO_TOKEN_ID = "oidc"  # what /me shows as the token id of a caller signed in through the provider


@dataclass(frozen=True)
class Endpoints:
    """What the discovery document says, of what edgectl uses."""

    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    jwks_uri: str


def _unavailable(what: str, exc: Exception | str) -> ApiError:
    return ApiError(503, f"the OpenID Connect provider cannot be used: {what} ({exc})", headers={"Retry-After": "5"})


def _read(request: urllib.request.Request | str, tls: ssl.SSLContext) -> Any:
    """A JSON document over HTTP(S), bounded in size and time; 503 when it cannot be had. An HTTP error status is
    raised as it is: what it means is the caller's to say."""
    url = request if isinstance(request, str) else request.full_url
    try:
        with urllib.request.urlopen(request, timeout=FETCH_TIMEOUT_S, context=tls) as response:
            return json.loads(response.read(MAX_DOCUMENT_BYTES + 1)[:MAX_DOCUMENT_BYTES])
    except urllib.error.HTTPError:
        raise
    except (OSError, ValueError) as exc:
        raise _unavailable(url, exc) from None


class Provider:
    """The issuer's discovery document and JWKS (over TLS trusting ``ca_file``, else the system's CAs); ``clock`` is a
    seam for the refetch interval."""

    def __init__(self, issuer: str, ca_file: Path | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.issuer, self.clock = issuer, clock
        self.tls = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
        self._endpoints: Endpoints | None = None
        self._keys: dict[str, jwt.PyJWK] = {}
        self._fetched: float | None = None
        self._lock = threading.Lock()

    def endpoints(self) -> Endpoints:
        if self._endpoints is None:
            url = self.issuer.rstrip("/") + "/.well-known/openid-configuration"
            try:
                document = _read(url, self.tls)
            except urllib.error.HTTPError as exc:
                raise _unavailable(url, f"HTTP {exc.code}") from None
            if not isinstance(document, dict) or document.get("issuer") != self.issuer:
                found = document.get("issuer") if isinstance(document, dict) else None
                raise _unavailable(url, f"its issuer is {found!r}, not api.oidc.issuer {self.issuer!r}")
            fields = ("authorization_endpoint", "token_endpoint", "jwks_uri")
            if not all(isinstance(document.get(name), str) for name in fields):
                raise _unavailable(url, f"it lacks one of {', '.join(fields)}")
            self._endpoints = Endpoints(self.issuer, *(str(document[name]) for name in fields))
        return self._endpoints

    def key(self, kid: str | None) -> jwt.PyJWK:
        """The signing key ``kid`` names (the only key when the token names none); 401 when the JWKS has no such key."""
        with self._lock:
            if self._fetched is None or (self._find(kid) is None and self.clock() - self._fetched >= REFETCH_S):
                self._keys = self._fetch_keys()
                self._fetched = self.clock()
            found = self._find(kid)
        if found is None:
            raise _refused(f"unknown key id {kid!r} (not in the provider's JWKS)" if kid else
                           "no key id (kid) and the provider's JWKS has more than one key")
        return found

    def _find(self, kid: str | None) -> jwt.PyJWK | None:
        if kid is None:
            return next(iter(self._keys.values())) if len(self._keys) == 1 else None
        return self._keys.get(kid)

    def _fetch_keys(self) -> dict[str, jwt.PyJWK]:
        url = self.endpoints().jwks_uri
        try:
            document = _read(url, self.tls)
        except urllib.error.HTTPError as exc:
            raise _unavailable(url, f"HTTP {exc.code}") from None
        keys: dict[str, jwt.PyJWK] = {}
        for data in document.get("keys", []) if isinstance(document, dict) else []:
            if not isinstance(data, dict) or data.get("use", "sig") != "sig" or data.get("kty") not in _KEY_TYPES.values():
                continue
            try:
                keys[str(data.get("kid", ""))] = jwt.PyJWK(data)
            except jwt.PyJWTError:
                continue  # a key of a kind this library cannot use: tokens it signed are refused as unknown key
        return keys

    def redeem(self, form: dict[str, str]) -> dict[str, Any]:
        """POST the token request; the provider's own refusal is a 400 that quotes it."""
        body = urllib.parse.urlencode(form).encode()
        request = urllib.request.Request(self.endpoints().token_endpoint, body, method="POST",
                                         headers={"Content-Type": "application/x-www-form-urlencoded",
                                                  "Accept": "application/json"})
        try:
            answer = _read(request, self.tls)
        except urllib.error.HTTPError as exc:
            detail = exc.read(2000).decode(errors="replace")
            try:
                parsed = json.loads(detail)
                detail = f"{parsed.get('error')}: {parsed.get('error_description', '')}".rstrip(": ")
            except (ValueError, AttributeError):
                detail = detail[:200]
            raise ApiError(400, f"code: the provider refused it ({detail})", field="code") from None
        if not isinstance(answer, dict):
            raise _unavailable("token endpoint", "its answer is not a JSON object")
        return answer


def _refused(reason: str) -> ApiError:
    return ApiError(401, f"token refused: {reason}",
                    headers={"WWW-Authenticate": f'Bearer realm="edgectl", error="invalid_token", '
                                                 f'error_description="{reason.replace(chr(34), chr(39))}"'})


def _claim(claims: dict[str, Any], path: str) -> Any:
    """The value at a dotted path (``realm_access.roles``), or None."""
    node: Any = claims
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _strings(value: Any) -> list[str]:
    """A roles claim's values: one string, or the strings of a list."""
    if isinstance(value, str):
        return [value]
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


class Sso:
    """Checks a provider's JWTs and maps them to a caller; redeems the console's code."""

    def __init__(self, settings: OidcSettings, provider: Provider) -> None:
        self.settings, self.provider = settings, provider
        self.roles = {value: Role(role) for value, role in settings.role_map.items()}
        self.audiences = [a for a in (settings.client_id, settings.audience) if a]

    def authenticate(self, authorization: str | None) -> Principal | None:
        """The caller a JWT proves; None for anything that is not a JWT (an edgectl token, no header); 401/403 else."""
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or token.count(".") != 2 or token.startswith("edgectl_"):
            return None
        return self.principal(self.verify(token))

    def verify(self, token: str, nonce: str | None = None) -> dict[str, Any]:
        """The token's claims once its signature, issuer, audience and times hold (and its nonce, when given)."""
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise _refused(f"malformed ({exc})") from None
        alg = header.get("alg")
        if alg not in ALGORITHMS:
            raise _refused(f"algorithm {alg!r} is not accepted (only {', '.join(ALGORITHMS)})")
        kid = header.get("kid")
        key = self.provider.key(kid if isinstance(kid, str) else None)
        if key.key_type != _KEY_TYPES[str(alg)[:2]]:
            raise _refused(f"algorithm {alg} does not fit the provider's {key.key_type} key {kid!r}")
        try:
            claims: dict[str, Any] = jwt.decode(
                token, key.key, algorithms=[str(alg)], audience=self.audiences, issuer=self.settings.issuer,
                leeway=self.settings.leeway_s, options={"require": ["exp", "iat", "iss", "aud", "sub"]})
        except jwt.PyJWTError as exc:
            raise _refused(_reason(exc)) from None
        if nonce is not None and claims.get("nonce") != nonce:
            raise _refused("its nonce is not the one this sign-in sent")
        return claims

    def principal(self, claims: dict[str, Any]) -> Principal:
        name = next(str(claims[c]) for c in ("preferred_username", "email", "sub") if claims.get(c))
        values = _strings(_claim(claims, self.settings.roles_claim))
        matched = [self.roles[v] for v in values if v in self.roles]
        if not matched:
            raise ApiError(403, f"oidc:{name} has no edgectl role: claim {self.settings.roles_claim} holds "
                                f"{values or 'nothing'}, and api.oidc.role_map maps none of them")
        return Principal(f"oidc:{name}", max(matched, key=ROLES.index), SSO_TOKEN_ID)

    def console_config(self) -> dict[str, Any]:
        """What the console needs to send the browser to the provider (nothing secret)."""
        return {"enabled": True, "issuer": self.settings.issuer, "client_id": self.settings.client_id,
                "authorization_endpoint": self.provider.endpoints().authorization_endpoint,
                "scopes": self.settings.scopes}

    def sign_in(self, code: str, code_verifier: str, redirect_uri: str, nonce: str) -> tuple[str, dict[str, Any]]:
        """Redeem the console's code; the ID token (its nonce checked) and the caller it names, or 400/401/403."""
        form = {"grant_type": "authorization_code", "code": code, "code_verifier": code_verifier,
                "redirect_uri": redirect_uri, "client_id": self.settings.client_id}
        if self.settings.client_secret:
            form["client_secret"] = self.settings.client_secret
        answer = self.provider.redeem(form)
        token = answer.get("id_token")
        if not isinstance(token, str):
            raise _unavailable("token endpoint", "its answer has no id_token (is the openid scope allowed?)")
        claims = self.verify(token, nonce)
        principal = self.principal(claims)
        return token, {"user": principal.user, "role": principal.role.value, "expires": claims["exp"]}


def _reason(exc: jwt.PyJWTError) -> str:
    """One line for why PyJWT refused a token."""
    if isinstance(exc, jwt.ExpiredSignatureError):
        return "expired (exp is past, beyond the allowed leeway)"
    if isinstance(exc, jwt.InvalidAudienceError):
        return "wrong audience (aud names neither api.oidc.client_id nor api.oidc.audience)"
    if isinstance(exc, jwt.InvalidIssuerError):
        return "wrong issuer (iss is not api.oidc.issuer)"
    if isinstance(exc, jwt.ImmatureSignatureError):
        return "not valid yet (nbf or iat is in the future, beyond the allowed leeway)"
    if isinstance(exc, jwt.InvalidSignatureError):
        return "bad signature"
    if isinstance(exc, jwt.MissingRequiredClaimError):
        return f"missing claim {exc.claim}"
    if isinstance(exc, jwt.DecodeError):
        return f"malformed ({exc})"
    return str(exc)


def sso_from_settings(settings: OidcSettings) -> Sso | None:
    """The SSO checker ``api.oidc`` describes, None when it is off; ConfigError naming a wrong key."""
    if not settings.issuer:
        return None
    if not settings.issuer.startswith("https://"):
        raise ConfigError(f"api.oidc.issuer {settings.issuer!r}: expected the provider's https:// URL")
    if settings.ca_file is not None and not settings.ca_file.is_file():
        raise ConfigError(f"api.oidc.ca_file {settings.ca_file}: no such file")
    if not settings.client_id:
        raise ConfigError("api.oidc.client_id: set it to the console's client id at the provider")
    known = {r.value for r in ROLES}
    for value, role in settings.role_map.items():
        if role not in known:
            raise ConfigError(f"api.oidc.role_map {value!r}: {role!r} is not one of {', '.join(sorted(known))}")
    if not settings.role_map:
        raise ConfigError("api.oidc.role_map: map at least one value of the roles claim to viewer, operator or admin")
    if not 0 <= settings.leeway_s <= 600:
        raise ConfigError(f"api.oidc.leeway_s {settings.leeway_s}: expected 0 to 600 seconds")
    return Sso(settings, Provider(settings.issuer, settings.ca_file))
