"""The web console in a real headless Chromium against a real controller, Mosquitto and `edgectl sim` fleet.

Every step goes through the browser as an operator would (sign in, filter, upload, start, pause,
abort); the page is never reloaded after sign-in, so the statuses seen changing arrive by the
console's live updates. Setup the browser is not under test for (an upload before a pause) goes
through the API directly.
"""

from __future__ import annotations

import http.client
import json

import pytest

from tests.console.browser import Browser
from tests.console.conftest import PROFILES, ConsolePlane, screenshot

pytestmark = pytest.mark.slow


def _status(browser: Browser) -> str:
    return str(browser.js("const el = document.getElementById('rollout-status'); return el ? el.dataset.status : ''"))


def _wait_status(browser: Browser, wanted: str, timeout: float = 60) -> None:
    browser.wait(lambda: _status(browser) == wanted, timeout, f"rollout status {wanted} (now {_status(browser)!r})")


def _mark_page(browser: Browser) -> None:
    """A flag on the window that a reload would lose: proves later changes came by live updates."""
    browser.js("window.__sameDocument = true;")


def _same_page(browser: Browser) -> bool:
    return bool(browser.js("return window.__sameDocument === true;"))


def _uploaded(plane: ConsolePlane, name: str, version: int) -> str:
    """The variant id of an uploaded package, uploading it through the API when it is not there yet."""
    status, listing = plane.api("GET", "/packages", "viewer")
    assert status == 200, listing
    for p in listing["packages"]:
        if p["name"] == name and p["version"] == version:
            return str(p["variant"])
    status, uploaded = plane.api("POST", "/packages", raw=plane.package(name, version).read_bytes())
    assert status == 201, uploaded
    return str(uploaded["variant"])


def _start_rollout(plane: ConsolePlane, selector: str, bake: str = "10m") -> str:
    body = {"packages": [_uploaded(plane, "classifier", 1)], "selector": selector, "waves": "1,100%", "bake": bake}
    status, created = plane.api("POST", "/rollouts", body=body)
    assert status == 201, created
    return str(created["rollout_id"])


def test_sign_in_and_see_the_simulated_fleet(plane: ConsolePlane, browser: Browser) -> None:
    browser.open("/")
    browser.ready("signin")  # no token yet: the console asks for one
    browser.css("#token").send_keys("edgectl_000000000000_" + "x" * 43)
    browser.click("#signin")
    browser.wait(lambda: "refused" in browser.text("#signin-error"), 10, "a wrong token refused")

    browser.sign_in(plane.tokens["operator"])
    total = sum(PROFILES.values())
    assert browser.text("[data-card=total] .big") == str(total)
    assert browser.text("[data-card=online] .big") == str(total)
    targets = browser.text("[data-breakdown='By target']")
    for profile, count in PROFILES.items():
        assert f"{profile}\n{count}" in targets, targets
    assert browser.text("#who") == "operator (operator)"

    browser.go("/devices", ready="devices")
    assert len(browser.attributes("#devices-table tbody tr", "data-device")) == total
    screenshot(browser, "devices")
    browser.click("#device-filters select[name=target] option[value=nnapi]")
    browser.click("#device-filters button[type=submit]")
    browser.wait(lambda: browser.text("#page-info") == "1–2 of 2", 20, "the server-side target filter")
    assert browser.attributes("#devices-table tbody tr", "data-device") == ["sim-nnapi-000", "sim-nnapi-001"]

    browser.click("a[href='#/devices/sim-nnapi-000']")
    browser.ready("device")
    assert browser.text("#device-model") == "none"
    assert set(browser.attributes("figure[data-chart]", "data-chart")) == {
        "Inference latency", "Inference rate", "CPU", "Memory"}

    browser.go("/devices?limit=3", ready="devices")  # pages of 3, asked of the server page by page
    assert browser.text("#page-info") == f"1–3 of {total}" and not browser.enabled("#prev")
    browser.click("#next")
    browser.wait(lambda: browser.text("#page-info") == f"4–6 of {total}", 20, "the second page")
    rows = browser.attributes("#devices-table tbody tr", "data-device")
    assert rows == ["sim-jetson-orin-000", "sim-jetson-orin-001", "sim-nnapi-000"], rows
    browser.click("#next")
    browser.wait(lambda: browser.text("#page-info") == f"7–7 of {total}", 20, "the last page")
    assert not browser.enabled("#next")


def test_start_a_rollout_from_the_console_and_watch_it_reach_done(plane: ConsolePlane, browser: Browser) -> None:
    browser.sign_in(plane.tokens["operator"])
    browser.go("/packages", ready="packages")
    browser.css("#package-file").send_keys(str(plane.package("classifier", 1)))
    browser.click("#upload button[type=submit]")
    browser.wait(lambda: "verified" in browser.text("#flash"), 30, "the upload verified")
    assert "classifier" in browser.text("#packages-table tbody")
    screenshot(browser, "packages")

    browser.click("#packages-table a[href^='#/rollouts/new']")
    browser.ready("rollout-new")
    selector = browser.css("#rollout-form input[name=selector]")
    selector.clear()
    selector.send_keys("target=cpu-x86")
    for name, value in (("waves", "1,100%"), ("bake", "1s")):
        field = browser.css(f"#rollout-form input[name={name}]")
        field.clear()
        field.send_keys(value)
    browser.click("#preview")
    browser.wait(lambda: "dry run" in browser.text("#plan"), 20, "the dry-run plan")
    plan = browser.text("#plan tbody")
    assert "sim-cpu-x86-000" in plan and "2: sim-cpu-x86-001, sim-cpu-x86-002" in plan, plan
    screenshot(browser, "new-rollout")

    browser.click("#start")
    browser.ready("rollout")
    _mark_page(browser)
    _wait_status(browser, "done", 90)
    assert _same_page(browser)
    assert "ok 3" in browser.text("#device-states")
    assert "pass" in browser.text("#gates")
    screenshot(browser, "rollout")

    browser.go("/devices/sim-cpu-x86-000", ready="device")
    browser.wait(lambda: browser.text("#device-model") == "classifier v1", 20, "the device page showing its new model")
    for chart in ("Inference latency", "Inference rate", "CPU", "Memory"):
        line = f"figure[data-chart='{chart}'] svg path"
        browser.wait(lambda line=line: browser.all(line), 20, f"a line in {chart}")  # type: ignore[misc]
    screenshot(browser, "device", settle_s=15)  # some history in the charts

    browser.go("/", ready="fleet")
    by_model = "[data-breakdown='By model version']"
    browser.wait(lambda: "classifier@1\n3" in browser.text(by_model), 20, "3 devices on classifier@1")
    screenshot(browser, "fleet")


def test_pause_and_abort_a_rollout_with_confirmation(plane: ConsolePlane, browser: Browser) -> None:
    rollout_id = _start_rollout(plane, "target=nnapi")
    browser.sign_in(plane.tokens["operator"])
    browser.go(f"/rollouts/{rollout_id}", ready="rollout")
    _mark_page(browser)
    _wait_status(browser, "running")

    browser.click("[data-action=pause]")
    browser.wait(lambda: browser.css("#confirm").is_displayed(), 10, "the confirmation dialog")
    browser.click("#confirm-cancel")  # cancelled: nothing is requested
    assert plane.api("GET", f"/rollouts/{rollout_id}", "viewer")[1]["status"] == "running"
    browser.click("[data-action=pause]")
    browser.click("#confirm-ok")
    _wait_status(browser, "paused")
    assert not browser.enabled("[data-action=pause]") and browser.enabled("[data-action=resume]")

    browser.click("[data-action=abort]")
    assert "roll back" in browser.text("#confirm-text")
    browser.click("#confirm-ok")
    _wait_status(browser, "aborted")
    assert _same_page(browser)
    assert browser.attributes("#rollout-actions button", "disabled") == [""] * 4  # all four disabled
    audit = plane.api("GET", f"/audit?rollout_id={rollout_id}", "viewer")[1]
    actions = [(a["action"], a["actor"]) for a in audit["entries"]]
    assert ("pause requested", "api:operator") in actions and ("abort requested", "api:operator") in actions, actions


def test_a_viewer_cannot_abort(plane: ConsolePlane, browser: Browser) -> None:
    rollout_id = _start_rollout(plane, "target=jetson-orin")
    try:
        browser.sign_in(plane.tokens["viewer"])
        assert browser.text("#who") == "viewer (viewer)"
        assert browser.text("[data-card=active-rollouts] .big") == "1"
        browser.go(f"/rollouts/{rollout_id}", ready="rollout")
        _wait_status(browser, "running")
        assert not browser.enabled("[data-action=abort]")
        assert "viewer" in browser.text("#rollout-actions")
        browser.go("/rollouts", ready="rollouts")
        assert not browser.all("#new-rollout")
        # The button is only a courtesy: the server refuses the viewer's request itself.
        assert browser.fetch("POST", f"/rollouts/{rollout_id}/abort", {}) == 403
        assert plane.api("GET", f"/rollouts/{rollout_id}", "viewer")[1]["status"] == "running"
    finally:
        plane.api("POST", f"/rollouts/{rollout_id}/abort", body={})


def test_a_revoked_token_returns_the_console_to_sign_in(plane: ConsolePlane, browser: Browser) -> None:
    created = json.loads(plane.home.edgectl("tokens", "create", "operator", "--name", "revoked", "--json", check=True).stdout)
    browser.sign_in(created["token"])
    browser.go("/devices", ready="devices")
    assert plane.api("DELETE", f"/tokens/{created['id']}", "admin")[0] == 200
    browser.ready("signin", timeout=20)  # the next live update is answered 401
    assert "token" in browser.text("#flash")
    assert browser.js("return sessionStorage.getItem('edgectl.token');") is None


def test_a_body_a_route_does_not_read_leaves_the_connection_usable(plane: ConsolePlane) -> None:
    """Browsers keep connections alive: a POST body the route never reads (the console's actions once sent "{}")
    must not be taken for the start of the next request on that connection."""
    connection = http.client.HTTPConnection(plane.url.removeprefix("http://"), timeout=30)
    headers = {"Authorization": f"Bearer {plane.tokens['viewer']}", "Content-Type": "application/json"}
    try:
        statuses = []
        for body in (b"{}", None, None):  # GET /me takes no body: the first one is never read
            connection.request("GET", "/api/v1/me", body, headers)
            response = connection.getresponse()
            response.read()
            statuses.append(response.status)
            if response.getheader("Connection") == "close":
                connection.close()
        assert statuses == [200, 200, 200], statuses
    finally:
        connection.close()
