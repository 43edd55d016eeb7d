"""Who may call what on the REST API, route by route, with ``api.metrics_open`` off and on.

The API server runs in this process on a free port (the real route table, the real HTTP server,
a SQLite store); every route is called with no token, a token of each role and a revoked one.
The expected role of each route is written out here, so a route that loses its role fails.
``api.metrics_open`` opens ``/metrics`` and nothing else: it is read in one place, the route table.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from edgectl.api.accounts import Accounts
from edgectl.api.app import api_context, api_routes
from edgectl.api.server import ApiServer
from edgectl.config import ApiSettings, EdgectlConfig
from edgectl.controller.accounts import ROLES, Role
from edgectl.controller.store import SqliteStore
from edgectl.keys import Keyring

VIEWER, OPERATOR, ADMIN = Role.VIEWER, Role.OPERATOR, Role.ADMIN
ROUTES: dict[tuple[str, str], Role | None] = {
    ("GET", "/api/v1/fleet/summary"): VIEWER,
    ("GET", "/api/v1/devices"): VIEWER,
    ("GET", "/api/v1/devices/{device_id}"): VIEWER,
    ("POST", "/api/v1/devices/{device_id}/decommission"): OPERATOR,
    ("POST", "/api/v1/devices/{device_id}/logs"): OPERATOR,
    ("GET", "/api/v1/devices/{device_id}/logs"): OPERATOR,
    ("GET", "/api/v1/devices/{device_id}/config"): VIEWER,
    ("PUT", "/api/v1/devices/{device_id}/config"): OPERATOR,
    ("DELETE", "/api/v1/devices/{device_id}"): ADMIN,
    ("GET", "/api/v1/packages"): VIEWER,
    ("POST", "/api/v1/packages"): OPERATOR,
    ("DELETE", "/api/v1/packages/{variant}"): OPERATOR,
    ("GET", "/api/v1/rollouts"): VIEWER,
    ("POST", "/api/v1/rollouts"): OPERATOR,
    ("GET", "/api/v1/rollouts/{rollout_id}"): VIEWER,
    ("POST", "/api/v1/rollouts/{rollout_id}/pause"): OPERATOR,
    ("POST", "/api/v1/rollouts/{rollout_id}/resume"): OPERATOR,
    ("POST", "/api/v1/rollouts/{rollout_id}/abort"): OPERATOR,
    ("POST", "/api/v1/rollouts/{rollout_id}/retry-failed"): OPERATOR,
    ("POST", "/api/v1/rollouts/{rollout_id}/approve"): OPERATOR,
    ("POST", "/api/v1/rollouts/{rollout_id}/reject"): OPERATOR,
    ("GET", "/api/v1/groups"): VIEWER,
    ("POST", "/api/v1/groups"): OPERATOR,
    ("GET", "/api/v1/groups/{name}"): VIEWER,
    ("PATCH", "/api/v1/groups/{name}"): OPERATOR,
    ("DELETE", "/api/v1/groups/{name}"): OPERATOR,
    ("PUT", "/api/v1/groups/{name}/config"): OPERATOR,
    ("GET", "/api/v1/health"): None,
    ("GET", "/api/v1/me"): VIEWER,
    ("GET", "/api/v1/audit"): VIEWER,
    ("GET", "/api/v1/users"): ADMIN,
    ("POST", "/api/v1/users"): ADMIN,
    ("DELETE", "/api/v1/users/{name}"): ADMIN,
    ("GET", "/api/v1/tokens"): ADMIN,
    ("POST", "/api/v1/tokens"): ADMIN,
    ("DELETE", "/api/v1/tokens/{token_id}"): ADMIN,
    ("GET", "/api/v1/webhooks"): OPERATOR,
    ("POST", "/api/v1/webhooks"): ADMIN,
    ("GET", "/api/v1/webhooks/{webhook_id}"): OPERATOR,
    ("DELETE", "/api/v1/webhooks/{webhook_id}"): ADMIN,
    ("GET", "/api/v1/webhooks/{webhook_id}/deliveries"): OPERATOR,
    ("POST", "/api/v1/webhooks/{webhook_id}/deliveries/{delivery_id}/redeliver"): ADMIN,
    ("GET", "/api/v1/openapi.json"): None,
    ("GET", "/api/v1/sso"): None,  # single sign-on: the console asks before it has a token (tests/sso)
    ("POST", "/api/v1/sso/token"): None,
    ("GET", "/metrics"): VIEWER,
}


@dataclass
class Api:
    server: ApiServer
    tokens: dict[str, str]  # caller name -> token

    def call(self, method: str, path: str, caller: str | None) -> tuple[int, dict[str, str], bytes]:
        headers = {"Authorization": f"Bearer {self.tokens[caller]}"} if caller else {}
        request = urllib.request.Request(self.server.url + path, method=method, headers=headers,
                                         data=b"" if method in ("POST", "DELETE") else None)
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return answer.status, dict(answer.headers), answer.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), exc.read()


@pytest.fixture(scope="module", params=[False, True], ids=["metrics-closed", "metrics-open"])
def api(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    """One server per setting for the module: the calls change nothing that another test reads."""
    tmp_path = tmp_path_factory.mktemp("api")
    store = SqliteStore(tmp_path / "store.db")
    config = EdgectlConfig(api=ApiSettings(metrics_open=request.param))
    ctx = api_context(store, config, keyring=Keyring(tmp_path / "keys"))
    accounts = Accounts(store)
    tokens = {}
    for role in ROLES:
        accounts.add_user(f"{role}-user", role, "test")
        tokens[role.value] = accounts.create_token(f"{role}-user", "", None, "test")[1]
    revoked_row, tokens["revoked"] = accounts.create_token("admin-user", "old", None, "test")
    accounts.revoke_token(revoked_row.id, "test")
    tokens["forged"] = tokens["admin"][:-4] + ("AAAA" if not tokens["admin"].endswith("AAAA") else "BBBB")
    server = ApiServer(ctx, api_routes(ctx), "127.0.0.1", 0).start()
    yield Api(server, tokens)
    server.stop()
    store.close()


def _concrete(path: str) -> str:
    return path.replace("{device_id}", "dev-x").replace("{rollout_id}", "r-x").replace("{name}", "nobody") \
        .replace("{token_id}", "000000000000").replace("{webhook_id}", "wh_x").replace("{delivery_id}", "dlv_x")


def _expected_role(method: str, path: str, metrics_open: bool) -> Role | None:
    return None if (path == "/metrics" and metrics_open) else ROUTES[(method, path)]


def test_the_route_table_gives_each_route_its_role(api: Api) -> None:
    metrics_open = api.server.ctx.metrics_open
    routes = {(r.method, r.path): r.role for r in api.server.router.routes}
    assert routes == {key: _expected_role(*key, metrics_open) for key in ROUTES}


@pytest.mark.parametrize(("method", "path"), list(ROUTES), ids=[f"{m} {p}" for m, p in ROUTES])
def test_each_route_answers_only_the_roles_it_allows(api: Api, method: str, path: str) -> None:
    needed = _expected_role(method, path, api.server.ctx.metrics_open)
    url = _concrete(path)
    for caller in (None, "revoked", "forged", *(r.value for r in ROLES)):
        status, headers, body = api.call(method, url, caller)
        role = Role(caller) if caller in {r.value for r in ROLES} else None
        if needed is None or (role is not None and role.allows(needed)):
            assert status not in (401, 403), f"{caller} on {method} {path}: {status} {body[:200]!r}"
        elif role is None:
            assert status == 401 and headers.get("WWW-Authenticate") == 'Bearer realm="edgectl"', (caller, status)
            assert "a valid bearer token is needed" in json.loads(body)["error"]["message"]
        else:
            assert status == 403, f"{caller} on {method} {path}: {status}"
            message = json.loads(body)["error"]["message"]
            assert message == f"{method} {path} needs the {needed} role; {caller}-user is {caller}"


def test_metrics_are_served_to_whoever_the_table_lets_in(api: Api) -> None:
    status, headers, body = api.call("GET", "/metrics", None)
    if api.server.ctx.metrics_open:
        assert status == 200 and headers["Content-Type"].startswith("text/plain") and b"edgectl_api_requests" in body
    else:
        assert status == 401
    assert api.call("GET", "/metrics", "viewer")[0] == 200


def test_each_role_may_do_what_the_roles_before_it_may() -> None:
    assert [[r.allows(needed) for needed in ROLES] for r in ROLES] == [
        [True, False, False],
        [True, True, False],
        [True, True, True],
    ]
