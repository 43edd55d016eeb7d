"""The REST API takes a real provider's JWTs (tests/sso/provider.py, pyop) beside edgectl tokens, and refuses each
kind of bad token with a 401 that says why; the role comes from the roles claim; nothing is stored for a refusal."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_pem_private_key

from tests.sso.conftest import CLIENT_ID, OidcProvider, SsoApi, rsa_pem


def test_a_token_from_the_code_flow_signs_in_with_its_role(provider: OidcProvider, sso_api: SsoApi) -> None:
    flow = provider.code_flow("alice", "http://127.0.0.1/console/")
    answer = sso_api.call("POST", "/api/v1/sso/token", body=flow)
    assert answer.status == 200, answer.body
    assert (answer.body["user"], answer.body["role"]) == ("oidc:alice", "operator")
    me = sso_api.call("GET", "/api/v1/me", answer.body["token"])
    assert me.status == 200 and me.body["user"] == "oidc:alice" and me.body["role"] == "operator"
    # an operator may create a group; the audit names the SSO user as its actor, and the sign-in before it
    group = {"name": "sso-made", "kind": "dynamic", "query": "target=x"}
    created = sso_api.call("POST", "/api/v1/groups", answer.body["token"], group)
    assert created.status == 201, created.body
    rows = sso_api.call("GET", "/api/v1/audit?actor=api:oidc:alice", answer.body["token"]).body["entries"]
    assert {r["action"] for r in rows} >= {"signed in", "group created"}, rows


def test_the_code_is_redeemed_once_and_only_with_its_pkce_verifier(provider: OidcProvider, sso_api: SsoApi) -> None:
    flow = provider.code_flow("alice", "http://127.0.0.1/console/")
    wrong = sso_api.call("POST", "/api/v1/sso/token", body={**flow, "code_verifier": "v" * 43})
    assert wrong.status == 400 and wrong.body["error"]["field"] == "code", wrong.body
    assert "provider refused" in wrong.body["error"]["message"]


def test_the_id_token_must_carry_the_nonce_of_the_sign_in(provider: OidcProvider, sso_api: SsoApi) -> None:
    flow = provider.code_flow("alice", "http://127.0.0.1/console/")
    answer = sso_api.call("POST", "/api/v1/sso/token", body={**flow, "nonce": "another-nonce"})
    assert answer.status == 401 and "nonce" in answer.body["error"]["message"], answer.body


@pytest.mark.parametrize("body, field", [({}, "code"), ({"code": "c", "code_verifier": "short", "redirect_uri": "u",
                                                          "nonce": "n"}, "code_verifier")])
def test_a_bad_sign_in_body_is_a_400_naming_the_field(sso_api: SsoApi, body: dict[str, str], field: str) -> None:
    answer = sso_api.call("POST", "/api/v1/sso/token", body=body)
    assert answer.status == 400 and field in answer.body["error"]["message"], answer.body


def test_the_console_learns_where_to_send_the_browser(provider: OidcProvider, sso_api: SsoApi) -> None:
    answer = sso_api.call("GET", "/api/v1/sso")
    assert answer.status == 200
    assert answer.body == {"enabled": True, "issuer": provider.issuer, "client_id": CLIENT_ID,
                           "authorization_endpoint": f"{provider.issuer}/authorize", "scopes": "openid profile email"}


def test_the_highest_mapped_role_wins_and_a_viewer_cannot_steer(provider: OidcProvider, sso_api: SsoApi) -> None:
    admin = provider.sign(provider.claims("alice", roles=["fleet-viewers", "fleet-admins", "fleet-operators"]))
    assert sso_api.call("GET", "/api/v1/me", admin).body["role"] == "admin"
    one_string = provider.sign(provider.claims("alice", roles="fleet-admins"))  # a claim may hold one string
    assert sso_api.call("GET", "/api/v1/me", one_string).body["role"] == "admin"
    viewer = provider.sign(provider.claims("victor"))
    refused = sso_api.call("POST", "/api/v1/groups", viewer, {"name": "by-viewer", "kind": "dynamic", "query": "target=x"})
    assert refused.status == 403 and "oidc:victor is viewer" in refused.body["error"]["message"]


def test_a_roles_claim_at_a_dotted_path(provider: OidcProvider, tmp_path_factory: pytest.TempPathFactory) -> None:
    from edgectl.api.oidc import Provider, Sso

    sso = Sso(provider.settings(roles_claim="realm_access.roles"), Provider(provider.issuer, provider.ca))
    claims = provider.claims("alice", roles=None, realm_access={"roles": ["fleet-admins"]})
    principal = sso.principal(sso.verify(provider.sign(claims)))
    assert (principal.user, principal.role.value) == ("oidc:alice", "admin")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unsigned(claims: dict[str, object]) -> str:
    return f"{_b64(json.dumps({'alg': 'none', 'kid': 'key-1'}).encode())}.{_b64(json.dumps(claims).encode())}."


def _tampered(token: str) -> str:
    header, payload, signature = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=="))
    return f"{header}.{_b64(json.dumps({**claims, 'roles': ['fleet-admins']}).encode())}.{signature}"


def _public_pem(provider: OidcProvider) -> bytes:
    key = load_pem_private_key(provider.keys["key-1"].encode(), None)
    return key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


REFUSALS: dict[str, tuple[Callable[[OidcProvider], str], str]] = {
    "expired": (lambda p: p.sign(p.claims(iat=int(time.time()) - 7200, exp=int(time.time()) - 3600)), "expired"),
    "wrong audience": (lambda p: p.sign(p.claims(aud="another-client")), "wrong audience"),
    "wrong issuer": (lambda p: p.sign(p.claims(iss=p.issuer + "/other")), "wrong issuer"),
    "not yet valid": (lambda p: p.sign(p.claims(nbf=int(time.time()) + 3600)), "not valid yet"),
    "issued in the future": (lambda p: p.sign(p.claims(iat=int(time.time()) + 3600)), "not valid yet"),
    "tampered": (lambda p: _tampered(p.sign(p.claims("victor"))), "bad signature"),
    "another key, same kid": (lambda p: p.sign(p.claims(), key=rsa_pem()), "bad signature"),
    "alg none": (lambda p: _unsigned(p.claims()), "algorithm 'none' is not accepted"),
    # the old confusion: HS256 keyed with the provider's public key, which anyone can fetch
    "HS256 with the public key": (lambda p: _hs256_with_public_key(p), "algorithm 'HS256' is not accepted"),
    "unknown kid": (lambda p: p.sign(p.claims(), kid="never-published", key=rsa_pem()), "unknown key id"),
    "ES256 naming the RSA key": (lambda p: p.sign(p.claims(), key=_ec_pem(), alg="ES256"), "does not fit"),
    "no exp": (lambda p: p.sign({k: v for k, v in p.claims().items() if k != "exp"}), "missing claim exp"),
    "malformed": (lambda p: "abc.def.ghi", "malformed"),
}


def _ec_pem() -> str:
    key = ec.generate_private_key(ec.SECP256R1())
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def _hs256_with_public_key(provider: OidcProvider) -> str:
    import hmac
    from hashlib import sha256

    signing = f"{_b64(json.dumps({'alg': 'HS256', 'kid': 'key-1'}).encode())}.{_b64(json.dumps(provider.claims()).encode())}"
    return f"{signing}.{_b64(hmac.new(_public_pem(provider), signing.encode(), sha256).digest())}"


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_a_bad_token_is_a_401_that_says_why(provider: OidcProvider, sso_api: SsoApi, case: str) -> None:
    make, reason = REFUSALS[case]
    before = sso_api.call("GET", "/api/v1/audit", provider.sign(provider.claims("victor"))).body["entries"]
    answer = sso_api.call("GET", "/api/v1/me", make(provider))
    assert answer.status == 401, answer.body
    assert reason in answer.body["error"]["message"], answer.body
    assert 'error="invalid_token"' in answer.headers["WWW-Authenticate"]
    after = sso_api.call("GET", "/api/v1/audit", provider.sign(provider.claims("victor"))).body["entries"]
    assert after == before  # nothing stored


def test_no_mapped_role_is_a_403_that_says_so(provider: OidcProvider, sso_api: SsoApi) -> None:
    answer = sso_api.call("GET", "/api/v1/me", provider.sign(provider.claims("nora")))
    assert answer.status == 403, answer.body
    assert "oidc:nora has no edgectl role" in answer.body["error"]["message"]
    assert "nobody-maps-this" in answer.body["error"]["message"]


def test_a_token_without_kid_is_checked_with_the_only_key(provider: OidcProvider, sso_api: SsoApi) -> None:
    token = jwt.encode(provider.claims("victor"), provider.keys["key-1"], algorithm="RS256")
    assert "kid" not in jwt.get_unverified_header(token)
    assert sso_api.call("GET", "/api/v1/me", token).body["user"] == "oidc:victor"


def test_edgectl_tokens_still_work_beside(sso_api: SsoApi) -> None:
    answer = sso_api.call("GET", "/api/v1/me", "edgectl_000000000000_" + "A" * 43)
    assert answer.status == 401 and "edgectl tokens create" in answer.body["error"]["message"]


def test_openapi_lists_the_scheme_and_the_sso_routes(sso_api: SsoApi) -> None:
    document = sso_api.call("GET", "/api/v1/openapi.json").body
    assert "oidc" in document["components"]["securitySchemes"], document["components"]["securitySchemes"]
    assert {"/api/v1/sso", "/api/v1/sso/token"} <= set(document["paths"])
