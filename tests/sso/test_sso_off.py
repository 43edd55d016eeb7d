"""Without ``api.oidc`` a JWT is no valid token, as before single sign-on, and the sign-in route says SSO is off."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from edgectl.api.app import api_context, api_routes
from edgectl.api.server import ApiServer
from edgectl.config import EdgectlConfig
from edgectl.controller.store import open_url
from tests.brokers import free_port
from tests.sso.conftest import OidcProvider, call


@pytest.fixture(scope="module")
def plain_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    store = open_url(str(tmp_path_factory.mktemp("store") / "controller.db"))
    ctx = api_context(store, EdgectlConfig())
    server = ApiServer(ctx, api_routes(ctx), "127.0.0.1", free_port()).start()
    try:
        yield server.url
    finally:
        server.stop()


def test_a_jwt_is_refused_as_any_unknown_token(provider: OidcProvider, plain_api: str) -> None:
    answer = call(f"{plain_api}/api/v1/me", token=provider.sign(provider.claims()))
    assert answer.status == 401 and "edgectl tokens create" in answer.body["error"]["message"]


def test_the_console_hears_sso_is_off_and_the_sign_in_route_says_so(plain_api: str) -> None:
    assert call(f"{plain_api}/api/v1/sso").body == {"enabled": False}
    body = {"code": "c", "code_verifier": "v" * 43, "redirect_uri": "u", "nonce": "n"}
    answer = call(f"{plain_api}/api/v1/sso/token", "POST", body=body)
    assert answer.status == 404 and "not configured" in answer.body["error"]["message"]
