"""Device groups in the console, in a real headless Chromium against a real controller, Mosquitto and `edgectl sim`:
create static and dynamic groups, change members, and start a rollout to a group picked on the new-rollout page."""

from __future__ import annotations

import pytest

from tests.console.browser import Browser
from tests.console.conftest import ConsolePlane

pytestmark = pytest.mark.slow


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
