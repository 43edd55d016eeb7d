"""Who may call what: 401 without a valid token, 403 for a role below the route's, per write endpoint and role."""

from __future__ import annotations

import hashlib
import sqlite3

import pytest

from tests.api.conftest import ENGINES, ApiPlane

# Every write endpoint and the least role that may call it. Bodies are valid enough to pass
# authorization; what happens after (400, 404, 409) is not this test's matter.
WRITES = [
    ("POST", "/api/v1/packages", "operator"),
    ("DELETE", "/api/v1/packages/v-none", "operator"),
    ("POST", "/api/v1/devices/dev-none/decommission", "operator"),
    ("POST", "/api/v1/devices/dev-none/logs", "operator"),
    ("PUT", "/api/v1/devices/dev-none/config", "operator"),
    ("DELETE", "/api/v1/devices/dev-none", "admin"),
    ("POST", "/api/v1/rollouts", "operator"),
    ("POST", "/api/v1/rollouts/r-none/pause", "operator"),
    ("POST", "/api/v1/rollouts/r-none/resume", "operator"),
    ("POST", "/api/v1/rollouts/r-none/abort", "operator"),
    ("POST", "/api/v1/rollouts/r-none/retry-failed", "operator"),
    ("POST", "/api/v1/rollouts/r-none/approve", "operator"),
    ("POST", "/api/v1/rollouts/r-none/reject", "operator"),
    ("POST", "/api/v1/groups", "operator"),
    ("PATCH", "/api/v1/groups/nobody", "operator"),
    ("DELETE", "/api/v1/groups/nobody", "operator"),
    ("PUT", "/api/v1/groups/nobody/config", "operator"),
    ("POST", "/api/v1/webhooks", "admin"),
    ("DELETE", "/api/v1/webhooks/wh-none", "admin"),
    ("POST", "/api/v1/webhooks/wh-none/deliveries/dl-none/redeliver", "admin"),
    ("POST", "/api/v1/users", "admin"),
    ("DELETE", "/api/v1/users/nobody", "admin"),
    ("POST", "/api/v1/tokens", "admin"),
    ("DELETE", "/api/v1/tokens/000000000000", "admin"),
]
RANK = {"viewer": 0, "operator": 1, "admin": 2}


def test_auth_matrix(api: ApiPlane) -> None:
    """Each write endpoint: no token and a wrong token get 401; each role below the needed one 403; the rest pass."""
    # The matrix covers every write endpoint the API has, with the role the document names.
    writes = {(r["method"], r["path"], r["role"]) for r in _routes(api) if r["method"] != "GET"}
    # the one write open to all: the console's single sign-on, which brings its proof in the body (tests/sso)
    assert writes == {(m, _template(p), role) for m, p, role in WRITES} | {("POST", "/api/v1/sso/token", None)}
    wrong = "edgectl_0123456789ab_" + "x" * 43
    failures = []
    for method, path, needed in WRITES:
        body: dict[str, object] | None = {} if method == "POST" and "packages" not in path else None
        raw = b"not a package" if path.endswith("/packages") else None
        for token in (None, wrong, "viewer", "operator", "admin"):
            answer = api.call(method, path, body, token=token, raw=raw)
            if token in (None, wrong):
                expected = {401}
            elif RANK[str(token)] < RANK[needed]:
                expected = {403}
            else:
                expected = {200, 201, 202, 400, 404, 409, 422}
            if answer.status not in expected:
                failures.append(f"{method} {path} as {token and token[:10]}: {answer.status} {answer.body}")
            assert (isinstance(answer.body, dict) and "error" in answer.body) or answer.status < 400, (method, path, answer)
    assert not failures, "\n".join(failures)


def _template(path: str) -> str:
    return path.replace("r-none", "{rollout_id}").replace("nobody", "{name}").replace("000000000000", "{token_id}") \
        .replace("dev-none", "{device_id}").replace("v-none", "{variant}").replace("wh-none", "{webhook_id}") \
        .replace("dl-none", "{delivery_id}")


def _routes(api: ApiPlane) -> list[dict[str, str]]:
    doc = api.call("GET", "/api/v1/openapi.json", token=None).body
    return [{"method": m.upper(), "path": p, "role": op["x-role"]} for p, ops in doc["paths"].items() for m, op in ops.items()]


def test_reads_need_a_token_and_viewer_reads(api: ApiPlane) -> None:
    for route in _routes(api):
        if route["method"] != "GET" or route["role"] is None or "{" in route["path"]:
            continue
        assert api.call("GET", route["path"], token=None).status == 401, route
        answer = api.call("GET", route["path"], token="viewer")
        assert answer.status == (200 if route["role"] == "viewer" else 403), (route, answer.body)
    answer = api.call("GET", "/api/v1/devices", token=None)
    assert answer.headers.get("WWW-Authenticate", "").startswith("Bearer")
    assert answer.body["error"]["status"] == 401


def test_me_names_the_caller(api: ApiPlane) -> None:
    assert api.call("GET", "/api/v1/me", token="admin").body["role"] == "admin"
    assert api.call("GET", "/api/v1/me", token="viewer").body == {
        "user": "viewer-user", "role": "viewer", "token_id": api.tokens["viewer"].split("_")[1]}


@pytest.mark.parametrize("api", ENGINES, indirect=True)
def test_revoked_token_and_removed_user_get_401(api: ApiPlane) -> None:
    token = api.add_user("temp", "operator")
    assert api.call("GET", "/api/v1/me", token=token).status == 200
    api.edgectl("tokens", "revoke", token.split("_")[1], check=True)
    assert api.call("GET", "/api/v1/me", token=token).status == 401
    second = api.call("POST", "/api/v1/tokens", {"user": "temp", "name": "ci"}, token="admin")
    assert second.status == 201, second.body
    assert api.call("GET", "/api/v1/me", token=second.body["token"]).status == 200
    assert api.call("DELETE", "/api/v1/users/temp", token="admin").status == 200
    assert api.call("GET", "/api/v1/me", token=second.body["token"]).status == 401


def test_tamperd_secret_gets_401(api: ApiPlane) -> None:
    token = api.tokens["admin"]
    flipped = token[:-1] + ("A" if token[-1] != "A" else "B")
    assert api.call("GET", "/api/v1/me", token=flipped).status == 401
    assert api.call("GET", "/api/v1/me", token=token.replace("Bearer", "")).status == 200
    assert api.call("GET", "/api/v1/me", token=None, headers={"Authorization": f"Basic {token}"}).status == 401


def _dump(api: ApiPlane) -> str:
    """Every row of every table of the store, as text."""
    if not api.store_url.startswith("postgresql"):
        with sqlite3.connect(api.store_path) as db:
            return "\n".join(db.iterdump())
    import psycopg

    with psycopg.connect(api.store_url) as db:
        tables = [r[0] for r in db.execute("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")]
        assert {"users", "tokens", "audit"} <= set(tables)
        return "\n".join(str(r[0]) for t in tables for r in db.execute(f"SELECT row_to_json(x)::text FROM {t} x"))


@pytest.mark.parametrize("api", ENGINES, indirect=True)
def test_only_hashes_are_stored(api: ApiPlane) -> None:
    dump = _dump(api)
    for token in api.tokens.values():
        secret = token[len("edgectl_") + 13:]  # after the 12-digit id and its underscore
        assert len(secret) == 43 and secret not in dump
        assert hashlib.sha256(token.encode()).hexdigest() in dump
        assert token.split("_")[1] in dump  # the id is what finds the row


@pytest.mark.parametrize("who", ["cli", "api"])
def test_account_changes_are_audited_with_their_actor(api: ApiPlane, who: str) -> None:
    if who == "cli":
        api.edgectl("users", "add", "carol", "--role", "viewer", check=True)
    else:
        assert api.call("POST", "/api/v1/users", {"name": "carol", "role": "viewer"}, token="admin").status == 201
    entries = api.call("GET", "/api/v1/audit", token="viewer").body["entries"]
    added = [e for e in entries if e["action"] == "user added" and e["detail"].startswith("carol")]
    assert len(added) == 1
    assert added[0]["actor"] == ("api:admin-user" if who == "api" else added[0]["actor"])
    assert added[0]["actor"].startswith(f"{who}:")
