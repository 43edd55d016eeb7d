"""The web console in a real headless Chromium against a real controller, Mosquitto and `edgectl sim` fleet.

Every step goes through the browser as an operator would (sign in, filter, upload, start, pause,
abort); the page is never reloaded after sign-in, so the statuses seen changing arrive by the
console's live updates. Setup the browser is not under test for (an upload before a pause) goes
through the API directly.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.request

import pytest
from selenium.webdriver.common.action_chains import ActionChains

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


def _start_rollout(plane: ConsolePlane, selector: str, bake: str = "10m", start_at: str | None = None) -> str:
    body = {"packages": [_uploaded(plane, "classifier", 1)], "selector": selector, "waves": "1,100%", "bake": bake}
    if start_at is not None:
        body["start_at"] = start_at
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
    browser.wait(lambda: browser.text("#page-info") == f"7–9 of {total}", 20, "the third page")
    browser.click("#next")
    browser.wait(lambda: browser.text("#page-info") == f"10–10 of {total}", 20, "the last page")
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
    row = "#device-models tr[data-model='classifier'] td"  # every model the device serves, with its version and backend
    browser.wait(lambda: browser.all(row), 20, "the classifier's row in the device's models")
    cells = browser.text("#device-models tr[data-model='classifier']")
    assert "v1" in cells and "onnxruntime" in cells, cells
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
    assert browser.attributes("#rollout-actions button", "disabled") == [""] * 6  # every action disabled
    audit = plane.api("GET", f"/audit?rollout_id={rollout_id}", "viewer")[1]
    actions = [(a["action"], a["actor"]) for a in audit["entries"]]
    assert ("pause requested", "api:operator") in actions and ("abort requested", "api:operator") in actions, actions


def test_a_second_operator_approves_and_rejects_on_the_rollout_page(plane: ConsolePlane, browser: Browser) -> None:
    """The two-person rule (docs/console.md): the creator's Approve is disabled and the server refuses it anyway; another
    operator approves (it is then scheduled: its start time is an hour away, nothing is sent) or rejects with a reason."""
    status, _ = plane.api("POST", "/groups", body={"name": "guarded", "kind": "static", "members": ["sim-jetson-orin-001"],
                                                   "protected": True})
    assert status == 201
    later = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600))
    made = [_start_rollout(plane, "group:guarded", start_at=later) for _ in range(2)]
    try:
        browser.sign_in(plane.tokens["operator"])
        browser.go(f"/rollouts/{made[0]}", ready="rollout")
        _wait_status(browser, "awaiting-approval")
        assert not browser.enabled("[data-action=approve]") and browser.enabled("[data-action=reject]")
        assert "two-person rule" in browser.text("#rollout-role-note")
        assert "targets protected group guarded" in browser.text("#rollout-approval")
        assert browser.fetch("POST", f"/rollouts/{made[0]}/approve", {}) == 403  # the server refuses the creator itself

        browser.sign_in(plane.tokens["admin"])
        browser.go(f"/rollouts/{made[0]}", ready="rollout")
        _wait_status(browser, "awaiting-approval")
        browser.click("[data-action=approve]")
        browser.click("#confirm-ok")
        _wait_status(browser, "scheduled")
        assert not browser.enabled("[data-action=approve]") and browser.enabled("[data-action=abort]")
        assert later in browser.text("#rollout-start")

        browser.go(f"/rollouts/{made[1]}", ready="rollout")
        _wait_status(browser, "awaiting-approval")
        browser.click("[data-action=reject]")  # no reason given: nothing is asked or sent
        browser.wait(lambda: "Give a reason" in browser.text("#flash"), 10, "the reason asked for")
        browser.css("#reject-reason").send_keys("wrong group")
        browser.click("[data-action=reject]")
        browser.click("#confirm-ok")
        _wait_status(browser, "rejected")
        assert browser.text("#rollout-reason") == "rejected by api:admin: wrong group"
        entries = {(e["rollout_id"], e["action"], e["actor"])
                   for e in plane.api("GET", "/audit?action=rollout%20*", "viewer")[1]["entries"]}
        assert {(made[0], "rollout approved", "api:admin"), (made[1], "rollout rejected", "api:admin")} <= entries
    finally:
        plane.api("POST", f"/rollouts/{made[0]}/abort", body={})
        plane.api("DELETE", "/groups/guarded")  # refused (409) while the aborted one settles: harmless


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


# -- the rollout page: waves, gates without data, an operator's abort, live updates, narrow screens, charts ----------

def _rollout(plane: ConsolePlane, selector: str, **body: object) -> str:
    request = {"packages": [_uploaded(plane, "classifier", 1)], "selector": selector, "waves": "1,100%", "bake": "1s", **body}
    status, created = plane.api("POST", "/rollouts", body=request)
    assert status == 201, created
    return str(created["rollout_id"])


def _settled(plane: ConsolePlane, rollout_id: str) -> None:
    """Abort a rollout (if it still runs) and wait until it is settled, so the next test finds its devices free."""
    plane.api("POST", f"/rollouts/{rollout_id}/abort", body={})
    deadline = time.monotonic() + 60
    while plane.api("GET", f"/rollouts/{rollout_id}", "viewer")[1]["status"] not in ("aborted", "done", "rolled-back"):
        assert time.monotonic() < deadline, f"rollout {rollout_id} did not settle"
        time.sleep(0.5)


def _metrics(plane: ConsolePlane) -> str:
    request = urllib.request.Request(f"{plane.url}/metrics", headers={"Authorization": f"Bearer {plane.tokens['viewer']}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return str(response.read().decode())


def _live_update(browser: Browser) -> None:
    """Wait for the page's next live update to finish."""
    def refreshed() -> int:
        return int(browser.js("return Number(document.body.dataset.refreshed || 0)"))
    before = refreshed()
    browser.wait(lambda: refreshed() > before, 20, "a live update")


def _wave_cell(browser: Browser, wave: int, cell: str) -> str:
    return browser.text(f"#waves tr[data-wave='{wave}'] td.{cell}")


def test_a_gate_without_data_holds_the_wave_in_the_console_api_and_metrics(plane: ConsolePlane, browser: Browser) -> None:
    """The qnn-htp devices run no model yet: no previous p95 to compare with, so the ratio gate has no data."""
    rollout_id = _rollout(plane, "target=qnn-htp", gates=["p95_latency <= 1.2x"])
    try:
        browser.sign_in(plane.tokens["operator"])
        browser.go(f"/rollouts/{rollout_id}", ready="rollout")
        browser.wait(lambda: browser.all("#waiting-for-data"), 90, "the waiting-for-data banner")
        banner = browser.text("#waiting-for-data")
        assert "Wave 1 is waiting for data" in banner and "p95_latency <= 1.2x" in banner and "halts at" in banner, banner
        assert browser.attributes("#gates tr[data-gate='p95_latency <= 1.2x']", "data-verdict") == ["no data"]
        assert "waiting for data" in browser.text("#rollout-wave")
        status = plane.api("GET", f"/rollouts/{rollout_id}", "viewer")[1]
        assert status["status"] == "running" and status["wave"] == 1 and status["phase"] == "waiting"
        waiting = status["waiting_for_data"]
        assert waiting["gates"] == ["p95_latency <= 1.2x"] and waiting["deadline"] > time.time()
        assert waiting["deadline"] == pytest.approx(waiting["since"] + 600)  # deploy.timeout_s after the bake
        gate = next(g for g in status["gate_values"] if g["metric"] == "p95_latency")
        assert (gate["verdict"], gate["holds"], gate["value"]) == ("no data", False, None)
        metrics = _metrics(plane)
        labels = f'gate="p95_latency <= 1.2x",metric="p95_latency",rollout="{rollout_id}"'
        assert f"edgectl_rollout_gate_no_data{{{labels}}} 1.0" in metrics
        assert f"edgectl_rollout_gate_holds{{{labels}}} 0.0" in metrics
        assert f'edgectl_rollout_data_deadline_seconds{{rollout="{rollout_id}",wave="1"}}' in metrics
    finally:
        _settled(plane, rollout_id)

    allowed = _rollout(plane, "target=qnn-htp", gates=["p95_latency <= 1.2x"], allow_no_data=True)
    deadline = time.monotonic() + 120
    while (status := plane.api("GET", f"/rollouts/{allowed}", "viewer")[1])["status"] != "done":
        assert time.monotonic() < deadline and status["status"] == "running", status
        time.sleep(0.5)
    assert status["allow_no_data"] is True
    audit = plane.api("GET", f"/audit?rollout_id={allowed}", "viewer")[1]["entries"]
    assert any("promotion without data allowed" in a["detail"] for a in audit if a["action"] == "rollout created")


def test_planned_waves_an_operators_abort_and_live_updates_on_the_rollout_page(plane: ConsolePlane, browser: Browser) -> None:
    rollout_id = _rollout(plane, "target=qnn-htp", bake="1h")
    try:
        browser.sign_in(plane.tokens["operator"])
        browser.go(f"/rollouts/{rollout_id}", ready="rollout")
        _mark_page(browser)
        browser.wait(lambda: _wave_cell(browser, 1, "wave-state") == "baking", 90, "wave 1 baking")
        assert (_wave_cell(browser, 2, "wave-state"), _wave_cell(browser, 2, "installing"),
                _wave_cell(browser, 2, "planned")) == ("planned", "0", "2")

        # Live updates keep the buttons: the focused one keeps the focus, an element found before a poll still clicks.
        browser.js("const b = document.querySelector('[data-action=pause]'); b.focus(); b.__kept = true;")
        abort = browser.css("[data-action=abort]")
        for _ in range(3):  # three live updates, each redrawing the page with the rollout's newest status
            _live_update(browser)
        assert browser.js("return document.activeElement.dataset.action === 'pause' && document.activeElement.__kept === true")
        abort.click()  # found before the updates: a rebuilt page would raise StaleElementReferenceException here
        browser.wait(lambda: browser.css("#confirm").is_displayed(), 10, "the confirmation dialog")
        browser.click("#confirm-ok")
        _wait_status(browser, "aborted", 90)
        assert _same_page(browser)

        assert (_wave_cell(browser, 1, "failed"), _wave_cell(browser, 1, "rolled-back")) == ("0", "1 (by the operator)")
        assert (_wave_cell(browser, 2, "wave-state"), _wave_cell(browser, 2, "planned")) == ("cancelled", "0")  # never started
        states = browser.text("#device-states")
        assert "rolled back by the operator 1" in states and "failed" not in states, states
        assert "rolled back by the operator" in browser.text("#rollout-devices tbody")
        verdicts = browser.attributes("#gates tbody tr", "data-verdict")
        assert verdicts and set(verdicts) == {"not judged"}, verdicts  # no "failure_rate 100 % fail" after an abort
    finally:
        _settled(plane, rollout_id)


def test_pages_read_on_a_400_px_screen(plane: ConsolePlane, browser: Browser) -> None:
    rollout_id = _rollout(plane, "target=qnn-htp", bake="1h")  # waves, gates and devices to lay out
    browser.sign_in(plane.tokens["viewer"])
    size = browser.driver.get_window_size()
    browser.driver.set_window_size(400, 900)
    try:
        # Signing in lands on "/": each route differs from the one before it, or no hashchange would draw the page.
        for page, ready in (("/devices", "devices"), ("/", "fleet"), ("/rollouts", "rollouts"), ("/packages", "packages"),
                            (f"/rollouts/{rollout_id}", "rollout"), ("/devices/sim-qnn-htp-000", "device")):
            browser.go(page, ready=ready)
            width = browser.js("return [document.documentElement.scrollWidth, window.innerWidth]")
            assert width[0] <= width[1], f"{page} is {width[0]} px wide in a {width[1]} px window"
        browser.go(f"/rollouts/{rollout_id}", ready="rollout")
        assert browser.js("const t = document.getElementById('rollout-devices'); return t.parentElement.scrollWidth > 0 "
                          "&& getComputedStyle(t.parentElement).overflowX === 'auto'")  # the table scrolls in its box
    finally:
        browser.driver.set_window_size(size["width"], size["height"])
        _settled(plane, rollout_id)


def test_charts_break_lines_at_gaps_and_show_values_on_hover(plane: ConsolePlane, browser: Browser) -> None:
    browser.sign_in(plane.tokens["viewer"])
    drawn = browser.driver.execute_async_script("""
        const done = arguments[arguments.length - 1];
        import("./charts.js").then((charts) => {
          const points = [[100, 1], [105, 2], [110, 3], [160, 4], [165, 5], [170, null], [175, 6]];
          const figure = charts.lineChart("gappy", [{ name: "p95", points }], "ms");
          figure.id = "gappy";
          document.getElementById("main").prepend(figure);
          done({ runs: charts.segments(points).map((r) => r.length),
                 moves: (figure.querySelector("path").getAttribute("d").match(/M/g) || []).length,
                 dots: figure.querySelectorAll("svg > circle[r='3']").length });
        }, (err) => done({ error: String(err) }));
    """)
    assert drawn == {"runs": [3, 2, 1], "moves": 3, "dots": 1}, drawn  # 50 s of silence and a null are gaps
    area = browser.css("#gappy .hover-area")
    ActionChains(browser.driver).move_to_element_with_offset(area, -int(area.size["width"] / 2) + 2, 0).perform()
    browser.wait(lambda: browser.text("#gappy .tip").endswith("p95 1.00 ms"), 10, "the tip at the first point")
    ActionChains(browser.driver).move_to_element_with_offset(area, int(area.size["width"] / 2) - 2, 0).perform()
    browser.wait(lambda: browser.text("#gappy .tip").endswith("p95 6.00 ms"), 10, "the tip at the last point")


# Kept last in the module: they take a device out of the module's fleet.

def test_decommission_then_delete_a_device_from_its_page(plane: ConsolePlane, browser: Browser) -> None:
    device, total = "sim-qnn-htp-002", sum(PROFILES.values())
    browser.sign_in(plane.tokens["operator"])
    browser.go(f"/devices/{device}", ready="device")
    assert not browser.all("#delete-device")  # a fleet member: only decommissioning is offered
    browser.click("#decommission")
    assert browser.text("#confirm-title") == f"Decommission {device}?" and "cannot be undone" in browser.text("#confirm-text")
    browser.click("#confirm-cancel")  # asked, declined: nothing happens
    assert plane.api("GET", f"/devices/{device}", "viewer")[1]["decommissioned"] is None
    browser.click("#decommission")
    browser.click("#confirm-ok")
    browser.wait(lambda: "decommissioned; certificate: no fleet PKI" in browser.text("#flash"), 20, "the outcome")
    browser.wait(lambda: browser.text("#device-status") == "decommissioned", 20, "the page showing it")
    assert not browser.all("#delete-device")  # deleting is an admin's
    listed = plane.api("GET", "/devices?limit=100", "viewer")[1]
    assert device not in [d["device_id"] for d in listed["devices"]] and listed["total"] == total - 1
    assert plane.api("GET", "/fleet/summary", "viewer")[1]["total"] == total - 1

    browser.sign_in(plane.tokens["admin"])
    browser.go(f"/devices/{device}", ready="device")
    assert not browser.all("#decommission")
    browser.click("#delete-device")
    browser.click("#confirm-ok")
    browser.ready("devices")
    assert plane.api("GET", f"/devices/{device}", "viewer")[0] == 404


def test_delete_a_package_and_find_it_on_the_audit_page(plane: ConsolePlane, browser: Browser) -> None:
    used = _uploaded(plane, "classifier", 1)
    _start_rollout(plane, "target=nnapi", bake="0s")  # a rollout names it
    spare = plane.api("POST", "/packages", raw=plane.package("classifier", 9).read_bytes())[1]["variant"]
    browser.sign_in(plane.tokens["operator"])
    browser.go("/packages", ready="packages")
    browser.click(f"tr[data-package='{used}'] .delete-package")
    browser.click("#confirm-ok")
    browser.wait(lambda: "is used by rollout(s) r-" in browser.text("#flash"), 20, "the refusal naming the rollouts")
    browser.click(f"tr[data-package='{spare}'] .delete-package")
    browser.click("#confirm-ok")
    browser.wait(lambda: "Deleted classifier v9" in browser.text("#flash"), 20, "the deletion")
    browser.wait(lambda: spare not in browser.attributes("#packages-table tbody tr", "data-package"), 20, "its row gone")
    assert used in browser.attributes("#packages-table tbody tr", "data-package")

    browser.go("/audit", ready="audit")
    browser.css("#audit-filters input[name=actor]").send_keys("api:operator")
    browser.css("#audit-filters input[name=action]").send_keys("package *")
    browser.click("#audit-filters button[type=submit]")
    wanted = plane.api("GET", "/audit?actor=api:operator&action=package%20*", "viewer")[1]
    newest_first = [e["action"] for e in reversed(wanted["entries"])]
    assert newest_first[0] == "package deleted" and "package uploaded" in newest_first
    browser.wait(lambda: browser.attributes("#audit-table tbody tr", "data-action") == newest_first, 20, "the filtered page")
    browser.click("#audit-csv")
    # The CSV came from the server with the page's filters (its rows counted), saved from a blob: link (its cells are
    # tests/api/test_records_api.py's).
    browser.wait(lambda: browser.attributes("#audit-csv", "data-rows") == [str(wanted["total"])], 20, "the CSV fetched")
    assert browser.attributes("#audit-csv", "href")[0].startswith("blob:")

    browser.go("/audit?since=2030-01-02T00:00&until=2030-01-01T00:00")
    browser.wait(lambda: "'until': must be after 'since'" in browser.text("#flash"), 20, "the refused filter")
