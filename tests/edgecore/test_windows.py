"""Maintenance windows (edgecore/windows.py): parsing, open or closed in a zone, the next opening, deadlines."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from agent.config import AgentConfig, TrustSettings
from edgecore.errors import ConfigError, ProtocolError
from edgecore.protocol.device_config import ConfigSettings
from edgecore.protocol.messages import DeployOptions
from edgecore.protocol.reports import Birth
from edgecore.windows import Maintenance, Window, WindowError, Windows, device_timezone, next_open_all, zone

BERLIN = zone("Europe/Berlin")
TOKYO = zone("Asia/Tokyo")


def at(text: str, tz: object = BERLIN) -> float:
    """A local wall-clock time in ``tz`` as a Unix time."""
    return datetime.fromisoformat(text).replace(tzinfo=tz).timestamp()  # type: ignore[arg-type]


@pytest.mark.parametrize(("text", "canonical"), [
    ("daily 02:00-04:00", "daily 02:00-04:00"),
    ("mon-fri 22:00-02:00", "Mon-Fri 22:00-02:00"),
    ("Sat,Sun 00:00-24:00", "Sat-Sun 00:00-24:00"),
    ("Fri-Mon 01:00-02:30", "Mon,Fri-Sun 01:00-02:30"),
    ("Mon,Wed 23:30 - 00:15", "Mon,Wed 23:30-00:15"),
])
def test_windows_parse_to_one_canonical_text(text: str, canonical: str) -> None:
    assert str(Window.parse(text)) == canonical
    assert str(Window.parse(canonical)) == canonical


@pytest.mark.parametrize(("text", "says"), [
    ("02:00-04:00", "is not a window"),
    ("Funday 02:00-04:00", "'Funday' is not a day"),
    ("daily 25:00-04:00", "is not a time of day"),
    ("daily 02:60-04:00", "is not a time of day"),
    ("daily 24:00-04:00", "never stays open"),
    ("daily 02:00-24:30", "is not a time of day"),
    ("daily 03:00-03:00", "never stays open"),
    ("daily 2:00-4:00", "is not a window"),
])
def test_a_bad_window_is_refused_with_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(WindowError, match=says):
        Window.parse(text)


@pytest.mark.parametrize("text", ["daily 02:59-04:00", "daily 00:00-24:00", "daily 23:00-00:59"])
def test_edge_times_of_day_are_taken(text: str) -> None:
    assert str(Window.parse(text)) == text


def test_a_window_list_names_the_entry_that_is_wrong() -> None:
    assert len(Windows.parse(["daily 02:00-04:00"] * 16).windows) == 16  # the most a list holds
    with pytest.raises(WindowError, match=r"windows\[1\]: 'nope'"):
        Windows.parse(["daily 02:00-04:00", "nope"])
    with pytest.raises(WindowError, match="at most 16"):
        Windows.parse(["daily 02:00-04:00"] * 17)
    with pytest.raises(WindowError, match="a list of windows"):
        Windows.parse("daily 02:00-04:00")


def test_open_and_closed_in_the_devices_local_time() -> None:
    nights = Windows.parse(["Mon-Fri 22:00-02:00"])
    assert nights.is_open(at("2026-11-30T22:00"), BERLIN)  # Monday 22:00
    assert nights.is_open(at("2026-12-01T01:59"), BERLIN)  # Tuesday 01:59: Monday's window, crossing midnight
    assert not nights.is_open(at("2026-12-01T02:00"), BERLIN)  # the end is not inside
    assert not nights.is_open(at("2026-11-30T01:00"), BERLIN)  # Monday 01:00: Sunday's window, and Sunday has none
    assert nights.is_open(at("2026-11-28T01:00"), BERLIN)  # Saturday 01:00: Friday's window
    assert not nights.is_open(at("2026-11-28T22:30"), BERLIN)  # Saturday evening
    # The same instant is inside in Berlin and outside in Tokyo (eight hours later there).
    instant = at("2026-11-30T23:00")
    assert nights.is_open(instant, BERLIN) and not nights.is_open(instant, TOKYO)
    assert Windows().is_open(instant, BERLIN)  # no windows: no restriction
    nightly = Windows.parse(["daily 02:00-04:00"])
    assert nightly.is_open(at("2026-11-30T03:59"), BERLIN) and not nightly.is_open(at("2026-11-30T04:00"), BERLIN)
    sunday_night = Windows.parse(["Sun 22:00-02:00"])  # Monday 01:00 is Sunday's window, across the week's end
    assert sunday_night.is_open(at("2026-11-30T01:00"), BERLIN) and not sunday_night.is_open(at("2026-12-01T01:00"), BERLIN)


def test_the_next_opening_is_the_windows_start_in_local_time() -> None:
    nightly = Windows.parse(["daily 02:00-04:00"])
    assert nightly.next_open(at("2026-11-30T10:00"), BERLIN) == at("2026-12-01T02:00")
    assert nightly.next_open(at("2026-12-01T03:00"), BERLIN) == at("2026-12-01T03:00")  # open now: now
    weekend = Windows.parse(["Sat,Sun 00:00-24:00"])
    assert weekend.next_open(at("2026-11-30T10:00", TOKYO), TOKYO) == at("2026-12-05T00:00", TOKYO)


def test_windows_keep_their_local_hours_across_a_daylight_saving_change() -> None:
    nightly = Windows.parse(["daily 03:00-04:00"])
    before, after = at("2026-10-23T12:00"), at("2026-10-24T12:00")  # Berlin leaves summer time on 25 October, 03:00
    assert nightly.next_open(after, BERLIN) - nightly.next_open(before, BERLIN) == 25 * 3600  # type: ignore[operator]
    assert datetime.fromtimestamp(nightly.next_open(after, BERLIN), BERLIN).hour == 3  # type: ignore[arg-type]


def test_a_device_in_two_groups_installs_only_where_both_windows_overlap() -> None:
    a, b = Windows.parse(["daily 02:00-04:00"]), Windows.parse(["daily 03:00-05:00"])
    assert next_open_all([a, b], at("2026-11-30T10:00"), BERLIN) == at("2026-12-01T03:00")
    weekdays, weekend = Windows.parse(["Mon-Fri 02:00-04:00"]), Windows.parse(["Sat,Sun 02:00-04:00"])
    assert next_open_all([weekdays, weekend], at("2026-11-30T10:00"), BERLIN) is None  # they never overlap


def test_a_deadline_forces_what_windows_would_hold() -> None:
    weekend = Windows.parse(["Sat,Sun 00:00-24:00"])
    now, deadline = at("2026-11-30T10:00"), at("2026-12-02T09:00")
    assert Maintenance((weekend,), deadline).allowed_from(now, BERLIN) == deadline  # earlier than Saturday
    assert Maintenance((weekend,), deadline).allowed_from(deadline + 1, BERLIN) == deadline + 1
    assert Maintenance((weekend,)).allowed_from(now, BERLIN) == at("2026-12-05T00:00")
    never = Maintenance((Windows.parse(["Mon 01:00-02:00"]), Windows.parse(["Tue 01:00-02:00"])))
    assert never.allowed_from(now, BERLIN) is None
    assert Maintenance(never.schedules, deadline).allowed_from(now, BERLIN) == deadline


def test_maintenance_travels_as_json_and_refuses_what_is_malformed() -> None:
    sent = Maintenance((Windows.parse(["daily 02:00-04:00"]),), 1.8e9)
    assert Maintenance.from_json(sent.to_json()) == sent
    for bad, says in [([], "expected"), ({"windows": "daily 02:00-04:00"}, "lists of windows"),
                      ({"windows": [["nope"]]}, r"windows\[0\]\[0\]"), ({"force_at": float("inf")}, "force_at"),
                      ({"force_at": True}, "force_at"), ({"windows": [], "extra": 1}, "expected")]:
        with pytest.raises(WindowError, match=says):
            Maintenance.from_json(bad)
    with pytest.raises(WindowError, match="at most 16 lists"):
        Maintenance.from_json({"windows": [["daily 02:00-04:00"]] * 17})
    with pytest.raises(WindowError, match="force_at"):
        Maintenance.from_json({"force_at": 1e11})
    assert Maintenance.from_json({"windows": [["daily 02:00-04:00"]] * 16, "force_at": 0}).force_at == 0.0
    # Truthy when it says anything: windows, a deadline, or both; what is empty is not sent.
    assert Maintenance(force_at=1.0) and Maintenance((Windows.parse(["daily 02:00-04:00"]),)) and not Maintenance()
    assert DeployOptions(maintenance=Maintenance(force_at=1.0)).to_json()["maintenance"] == {"windows": [], "force_at": 1.0}


def test_zone_names_are_checked() -> None:
    assert zone("UTC") is not None
    for bad in ("Mars/Olympus", "../../etc/passwd", "/etc/localtime", "Europe/Berlin; rm", "", None, 7):
        with pytest.raises(WindowError):
            zone(bad)  # type: ignore[arg-type]


def test_the_device_time_zone_comes_from_config_env_or_etc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TZ", raising=False)
    etc = tmp_path / "etc"
    etc.mkdir()
    assert device_timezone(None, etc) is None  # nothing names one: unknown, not guessed
    (etc / "localtime").symlink_to("/usr/share/zoneinfo/Asia/Tokyo")
    assert device_timezone(None, etc) == "Asia/Tokyo"
    (etc / "timezone").write_text("America/Chicago\n")
    assert device_timezone(None, etc) == "America/Chicago"
    monkeypatch.setenv("TZ", ":Europe/Lisbon")
    assert device_timezone(None, etc) == "Europe/Lisbon"
    assert device_timezone("Europe/Berlin", etc) == "Europe/Berlin"
    assert device_timezone("Nowhere/Land", etc) == "Europe/Lisbon"  # agent.yaml refuses it at start; here: next source


def test_desired_state_options_carry_maintenance_and_refuse_a_malformed_one() -> None:
    sent = DeployOptions(False, None, Maintenance((Windows.parse(["daily 02:00-04:00"]),), 1.8e9))
    assert DeployOptions.read(sent.to_json(), "desired.models[0].options") == sent
    assert "maintenance" not in DeployOptions().to_json()  # nothing said: older agents see what they always saw
    with pytest.raises(ProtocolError, match=r"desired.models\[0\].options.maintenance.windows\[0\]\[0\]"):
        DeployOptions.read({"maintenance": {"windows": [["soon"]]}}, "desired.models[0].options")


def test_the_birth_says_the_time_zone_and_agent_yaml_refuses_an_unknown_one(tmp_path: Path) -> None:
    birth = Birth("cam-1", 1.0, timezone="Asia/Tokyo")
    assert Birth.from_payload(birth.to_payload()).timezone == "Asia/Tokyo"
    assert Birth.from_json({"device_id": "cam-1"}).timezone is None  # an older agent: unknown
    key = tmp_path / "package.pub"
    key.write_text("key")
    config = AgentConfig("cam-1", trust=TrustSettings([key]), timezone="Mars/Olympus")
    with pytest.raises(ConfigError, match="timezone: time zone 'Mars/Olympus'"):
        config.check("agent.yaml")


def test_a_configuration_may_set_the_devices_own_windows_and_a_bad_one_is_refused_naming_it() -> None:
    settings = ConfigSettings.from_json({"maintenance_windows": ["sat,sun 00:00-24:00"]})
    assert settings.maintenance_windows == ("Sat-Sun 00:00-24:00",)
    assert ConfigSettings.from_json(settings.to_json()) == settings
    assert ConfigSettings.from_json({"maintenance_windows": []}).maintenance_windows == ()  # none: install any time
    with pytest.raises(ProtocolError, match=r"settings.maintenance_windows\[0\]: 'often'"):
        ConfigSettings.from_json({"maintenance_windows": ["often"]})
    assert Birth.from_payload(Birth("cam-1", maintenance_windows=("daily 02:00-04:00",)).to_payload()) \
        .maintenance_windows == ("daily 02:00-04:00",)
