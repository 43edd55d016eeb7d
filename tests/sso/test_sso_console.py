"""The console's "Sign in with SSO" in a real Chromium: through the real provider's login page (tests/sso/provider.py,
which takes only PKCE with S256) and back, the role from the roles claim, sign-out, an expired token, a forged state."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.brokers import BrokerProcess, mosquitto_binary, start_mosquitto
from tests.console.browser import Browser, missing
from tests.console.conftest import ConsolePlane, start_plane
from tests.sso.conftest import CLIENT_ID, CLIENT_SECRET, ROLE_MAP, OidcProvider


@pytest.fixture(scope="module")
def sso_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ConsolePlane, OidcProvider]]:
    if mosquitto_binary() is None:
        pytest.fail("mosquitto is not installed: ./scripts/test installs it (apt-get install mosquitto)")
    root = tmp_path_factory.mktemp("sso-console")
    provider = OidcProvider(root / "oidc", [])
    oidc = {"issuer": provider.issuer, "client_id": CLIENT_ID, "client_secret": CLIENT_SECRET, "roles_claim": "roles",
            "role_map": ROLE_MAP, "ca_file": str(provider.ca)}
    broker: BrokerProcess = start_mosquitto(root / "mosquitto")
    plane = None
    try:
        plane = start_plane(root, broker, {"api": {"oidc": oidc}})
        provider.redirect_uris = [plane.console]
        provider.start()
        yield plane, provider
    finally:
        provider.stop()
        if plane is not None:
            plane.stop()
        broker.stop()


@pytest.fixture(scope="module")
def browser(sso_plane: tuple[ConsolePlane, OidcProvider]) -> Iterator[Browser]:
    reason = missing()
    if reason:
        pytest.skip(reason)
    started = Browser(sso_plane[0].console, accept_insecure_certs=True)
    try:
        yield started
    finally:
        started.close()


def sso_sign_in(browser: Browser, provider: OidcProvider, user: str, password: str) -> None:
    browser.open("/signin", ready="signin")
    browser.click("#sso")
    browser.wait(lambda: browser.driver.current_url.startswith(provider.issuer + "/authorize"), 30, "the provider's page")
    assert "code_challenge_method=S256" in browser.driver.current_url
    browser.css("#username").send_keys(user)
    browser.css("#password").send_keys(password)
    browser.click("#login")


def test_sign_in_through_the_provider_sees_the_fleet_and_signs_out(sso_plane: tuple[ConsolePlane, OidcProvider],
                                                                     browser: Browser) -> None:
    plane, provider = sso_plane
    sso_sign_in(browser, provider, "alice", "alice-pw")
    browser.ready("fleet")
    assert browser.text("#who") == "oidc:alice (operator)"
    assert "code=" not in browser.driver.current_url  # the used code is not left in the address bar
    assert browser.fetch("GET", "/fleet/summary") == 200
    audit = plane.api("GET", "/audit?actor=api:oidc:alice", "viewer")[1]["entries"]
    assert [e["action"] for e in audit] == ["signed in"]
    browser.sign_out()
    assert browser.js("return sessionStorage.getItem('edgectl.token')") is None


def test_a_viewer_from_the_claim_cannot_abort(sso_plane: tuple[ConsolePlane, OidcProvider], browser: Browser) -> None:
    _plane, provider = sso_plane
    sso_sign_in(browser, provider, "victor", "victor-pw")
    browser.ready("fleet")
    assert browser.text("#who") == "oidc:victor (viewer)"
    assert browser.fetch("POST", "/rollouts/r-none/abort") == 403  # the role is checked before the rollout is looked up
    browser.sign_out()


def test_an_expired_token_returns_to_sign_in_saying_so(sso_plane: tuple[ConsolePlane, OidcProvider],
                                                        browser: Browser) -> None:
    _plane, provider = sso_plane
    now = int(time.time())
    expired = provider.sign(provider.claims("alice", iat=now - 7200, exp=now - 3600))
    sso_sign_in(browser, provider, "alice", "alice-pw")
    browser.ready("fleet")
    browser.go("/devices", ready="devices")
    browser.js("sessionStorage.setItem('edgectl.token', arguments[0])", expired)  # as if its hour had passed
    browser.ready("signin", timeout=20)  # the next live update is answered 401
    assert "token refused: expired" in browser.text("#flash")
    assert browser.js("return sessionStorage.getItem('edgectl.token')") is None


def test_an_answer_with_another_state_is_refused(sso_plane: tuple[ConsolePlane, OidcProvider], browser: Browser) -> None:
    _plane, provider = sso_plane
    sso_sign_in(browser, provider, "alice", "alice-pw")
    browser.ready("fleet")
    browser.sign_out()
    browser.open("/signin", ready="signin")
    browser.js("sessionStorage.setItem('edgectl.sso', JSON.stringify({state: 'mine', verifier: 'v', nonce: 'n'}))")
    browser.driver.get(f"{browser.base}?code=stolen&state=theirs")
    browser.ready("signin")
    assert "state is not the one this tab sent" in browser.text("#flash")
    assert browser.js("return sessionStorage.getItem('edgectl.token')") is None
