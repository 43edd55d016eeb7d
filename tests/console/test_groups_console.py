"""Device groups in the console, in a real headless Chromium against a real controller, Mosquitto and `edgectl sim`:
create static and dynamic groups, change members, and start a rollout to a group picked on the new-rollout page;
and the device page's Logs panel, with a real agent (kept in this module: a new one would start a whole plane)."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from tests.console.browser import Browser
from tests.console.conftest import ConsolePlane
from tests.fleet import AgentProcess, wait_for

pytestmark = pytest.mark.slow


def _flashed(browser: Browser, says: str) -> bool:
    return says in browser.text("#flash")


def _rows(browser: Browser, table: str, key: str) -> list[str]:
    return browser.attributes(f"{table} tbody tr", f"data-{key}")


def _create(browser: Browser, name: str, kind: str, definition: str) -> None:
    browser.css("#group-form input[name=name]").send_keys(name)
    browser.click(f"#group-form select[name=kind] option[value={kind}]")
    field = "#group-form " + ("textarea[name=members]" if kind == "static" else "input[name=query]")
    browser.css(field).send_keys(definition)
    browser.click("#group-form button[type=submit]")


def test_groups_page_and_a_rollout_to_a_picked_group(plane: ConsolePlane, browser: Browser) -> None:
    browser.sign_in(plane.tokens["operator"])
    browser.go("/groups", ready="groups")
    assert "No device group yet" in browser.text("#groups-table")
    _create(browser, "Bad Name", "static", "sim-cpu-x86-000")
    browser.wait(lambda: "name: 'Bad Name' is not a group name" in browser.text("#flash"), 10, "the bad name refused")
    assert plane.api("GET", "/groups", "viewer")[1]["groups"] == []  # nothing stored

    browser.css("#group-form input[name=name]").clear()
    _create(browser, "orins", "dynamic", "target=jetson-orin")
    browser.wait(lambda: _rows(browser, "#groups-table", "group") == ["orins"], 10, "the dynamic group listed")
    _create(browser, "pair", "static", "sim-cpu-x86-000, sim-nnapi-001")
    browser.wait(lambda: _rows(browser, "#groups-table", "group") == ["orins", "pair"], 10, "the static group listed")
    assert browser.attributes("#groups-table tbody td[data-resolved]", "data-resolved") == ["2", "2"]

    browser.click("#groups-table a[href='#/groups/pair']")
    browser.ready("group")
    assert _rows(browser, "#group-devices", "device") == ["sim-cpu-x86-000", "sim-nnapi-001"]
    browser.css("#member-form input[name=add]").send_keys("sim-qnn-htp-000")
    browser.click("#member-form button[type=submit]")
    browser.wait(lambda: len(_rows(browser, "#group-devices", "device")) == 3, 10, "a member added")
    browser.click("#group-devices tr[data-device=sim-nnapi-001] .remove-member")
    browser.wait(lambda: _rows(browser, "#group-devices", "device") == ["sim-cpu-x86-000", "sim-qnn-htp-000"], 10,
                 "a member removed")
    assert plane.api("GET", "/groups/pair", "viewer")[1]["members"] == ["sim-cpu-x86-000", "sim-qnn-htp-000"]

    status, package = plane.api("POST", "/packages", raw=plane.package("grouped", 1).read_bytes())
    assert status == 201, package
    browser.go(f"/rollouts/new?package={package['variant']}", ready="rollout-new")
    browser.click("#group-pick option[value=orins]")
    assert browser.css("#rollout-form input[name=selector]").get_attribute("value") == "group:orins"
    for name, value in (("waves", "100%"), ("bake", "1s")):
        field = browser.css(f"#rollout-form input[name={name}]")
        field.clear()
        field.send_keys(value)
    browser.click("#preview")
    browser.wait(lambda: "dry run" in browser.text("#plan"), 20, "the dry-run plan")
    assert "2: sim-jetson-orin-000, sim-jetson-orin-001" in browser.text("#plan tbody")
    browser.click("#start")
    browser.ready("rollout")
    rollout_id = browser.js("return location.hash").rsplit("/", 1)[1]
    rollout = plane.api("GET", f"/rollouts/{rollout_id}", "viewer")[1]
    assert rollout["selector"] == "group:orins"
    assert sorted(d["device_id"] for d in rollout["devices"]) == ["sim-jetson-orin-000", "sim-jetson-orin-001"]
    plane.api("POST", f"/rollouts/{rollout_id}/abort", body={})

    browser.sign_in(plane.tokens["viewer"])
    browser.go("/groups", ready="groups")
    assert not browser.all("#group-form") and _rows(browser, "#groups-table", "group") == ["orins", "pair"]


def test_device_logs_panel_fetches_a_real_agents_lines_for_operators_only(plane: ConsolePlane, browser: Browser,
                                                                          tmp_path: Path) -> None:
    """Remote logs on the device page (docs/console.md): a real agent answers through the controller."""
    agent = AgentProcess("cam-logs", tmp_path / "agent", plane.broker.url, [plane.home.public_key("package")],
                         [plane.home.public_key("controller")]).start()
    try:
        wait_for(lambda: plane.api("GET", "/devices/cam-logs", "viewer")[0] == 200, 30, "the agent in the store")
        browser.sign_in(plane.tokens["viewer"])
        browser.go("/devices/cam-logs", ready="device")
        assert "needs the operator role" in browser.text("#logs") and not browser.all("#fetch-logs")
        browser.sign_in(plane.tokens["operator"])
        browser.go("/devices/cam-logs", ready="device")
        browser.wait(lambda: "No logs fetched yet" in browser.text("#logs-status"), 10, "the panel says none yet")
        lines = browser.css("#logs-form input[name=lines]")
        lines.clear()
        lines.send_keys("5")
        browser.click("#fetch-logs")
        browser.wait(lambda: browser.all("#logs-lines") and "inference API on" in browser.text("#logs-lines"), 20,
                     "the agent's lines shown")
        latest = plane.api("GET", "/devices/cam-logs/logs")
        assert latest[0] == 200 and 0 < len(latest[1]["lines"]) <= 5
        assert browser.text("#logs-status").startswith(f"{len(latest[1]['lines'])} line(s), answered")
        assert all(line["level"] != "DEBUG" for line in latest[1]["lines"])  # the panel asks INFO and above
    finally:
        agent.stop()


def test_device_page_shows_desired_and_reported_configuration(plane: ConsolePlane, browser: Browser,
                                                              tmp_path: Path) -> None:
    """Device configuration on the device page (docs/console.md): set over the API, applied by a real agent."""
    agent = AgentProcess("cam-config", tmp_path / "agent", plane.broker.url, [plane.home.public_key("package")],
                         [plane.home.public_key("controller")]).start()
    try:
        wait_for(lambda: plane.api("GET", "/devices/cam-config", "viewer")[0] == 200, 30, "the agent in the store")
        browser.sign_in(plane.tokens["viewer"])
        browser.go("/devices/cam-config", ready="device")
        browser.wait(lambda: browser.all("#config-sync") and browser.text("#config-sync") == "none", 10, "no config yet")
        assert browser.text("#config-reported") == "nothing reported (unknown)"
        status, view = plane.api("PUT", "/devices/cam-config/config", body={"settings": {"telemetry_interval_s": 5}})
        assert status == 200 and view["desired"]["version"] == 1
        wait_for(lambda: plane.api("GET", "/devices/cam-config/config", "viewer")[1]["sync"] == "in sync", 30,
                 "the agent to apply configuration v1")
        # The page's live refresh reads the configuration again.
        browser.wait(lambda: browser.text("#config-sync") == "in sync", 10, "in sync on the open page")
        assert browser.text("#config-desired").startswith("v1: telemetry_interval_s=5 (by api:operator")
        assert browser.text("#config-reported") == "v1 applied; in force: v1"
        assert not browser.all("#config-form")  # viewers do not edit

        # An operator sets the next version on the page: bad JSON and a bad value are refused, nothing is stored.
        browser.sign_in(plane.tokens["operator"])
        browser.go("/devices/cam-config", ready="device")
        browser.wait(lambda: browser.css("#config-input").get_attribute("value") == '{"telemetry_interval_s":5}', 10,
                     "the editor filled with the desired settings")
        field = browser.css("#config-input")
        for text, says in (("{nope", "settings: not valid JSON"),
                           ('{"maintenance_windows": ["weekly"]}', "settings.maintenance_windows[0]: 'weekly'")):
            field.clear()
            field.send_keys(text)
            browser.click("#config-save")
            browser.wait(functools.partial(_flashed, browser, says), 10, f"refused: {says}")
        assert plane.api("GET", "/devices/cam-config/config", "viewer")[1]["desired"]["version"] == 1
        field.clear()
        field.send_keys('{"log_level": "DEBUG", "maintenance_windows": ["Sat,Sun 00:00-24:00"]}')
        browser.click("#config-save")
        wait_for(lambda: plane.api("GET", "/devices/cam-config/config", "viewer")[1]["sync"] == "in sync"
                 and plane.api("GET", "/devices/cam-config/config", "viewer")[1]["reported"]["applied_version"] == 2,
                 30, "the agent to apply configuration v2 set on the page")
        browser.wait(lambda: browser.text("#config-desired").startswith(
            'v2: log_level="DEBUG", maintenance_windows=["Sat-Sun 00:00-24:00"] (by api:operator'), 10, "v2 shown")
    finally:
        agent.stop()


def test_group_windows_protection_and_a_deadline_from_the_console(plane: ConsolePlane, browser: Browser) -> None:
    """Maintenance windows and the two-person flag set on the group page (a bad window refused, nothing stored); a
    rollout's forced-update deadline from the new-rollout page (docs/console.md)."""
    assert plane.api("POST", "/groups", body={"name": "night", "kind": "static", "members": ["sim-cpu-x86-000"]})[0] == 201
    browser.sign_in(plane.tokens["operator"])
    browser.go("/groups/night", ready="group")
    assert browser.text("#group-windows") == "Maintenance windows: none (installs any time)"
    windows = browser.css("#windows-input")
    windows.send_keys("Mon-Fri 22:00-02:00\nWeekends 01:00-02:00")
    browser.click("#settings-save")
    browser.wait(lambda: "windows[1]" in browser.text("#flash") and "'Weekends' is not a day" in browser.text("#flash"), 10,
                 "the bad window refused, naming it")
    assert plane.api("GET", "/groups/night", "viewer")[1]["windows"] == []  # nothing stored
    windows.clear()
    windows.send_keys("mon-fri 22:00-02:00\nSat,Sun 00:00-24:00")
    browser.click("#protected-input")
    browser.click("#settings-save")
    browser.wait(lambda: browser.text("#group-windows").startswith("Installs only inside: Mon-Fri 22:00-02:00; "
                                                                   "Sat-Sun 00:00-24:00 (each device's local time)"),
                 10, "the windows shown as kept")
    group = plane.api("GET", "/groups/night", "viewer")[1]
    assert group["windows"] == ["Mon-Fri 22:00-02:00", "Sat-Sun 00:00-24:00"] and group["protected"] is True
    assert "protected" in browser.text("#group-windows")

    config = browser.css("#group-config-input")
    config.clear()
    config.send_keys('{"log_level": "LOUD"}')
    browser.click("#group-config-save")
    browser.wait(lambda: "settings.log_level" in browser.text("#flash"), 10, "a bad setting refused, naming it")
    assert plane.api("GET", "/devices/sim-cpu-x86-000/config", "viewer")[1]["desired"] is None
    config.clear()
    config.send_keys('{"telemetry_interval_s": 20}')
    browser.click("#group-config-save")
    browser.wait(lambda: "Configuration stored for 1 device(s): sim-cpu-x86-000 v1" in browser.text("#flash"), 10,
                 "the group's devices configured")
    desired = plane.api("GET", "/devices/sim-cpu-x86-000/config", "viewer")[1]["desired"]
    assert desired["settings"] == {"telemetry_interval_s": 20}

    status, package = plane.api("POST", "/packages", raw=plane.package("nightly", 1).read_bytes())
    assert status == 201, package
    browser.go(f"/rollouts/new?package={package['variant']}&selector=group:night", ready="rollout-new")
    browser.js("document.querySelector('#deadline').value = '2099-01-02T03:04'")
    browser.click("#start")
    browser.ready("rollout")
    rollout_id = browser.js("return location.hash").rsplit("/", 1)[1]
    rollout = plane.api("GET", f"/rollouts/{rollout_id}", "viewer")[1]
    assert rollout["deadline"].startswith("2099-01-0") and rollout["approval"]  # protected: it waits for approval
    assert rollout["devices"][0]["windows"] == [["Mon-Fri 22:00-02:00", "Sat-Sun 00:00-24:00"]]
    plane.api("POST", f"/rollouts/{rollout_id}/reject", "admin", body={"reason": "test over"})
