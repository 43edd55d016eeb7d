"""``edgectl device config set|show`` in its own processes on a SQLite store: one-line errors with nothing stored."""

from __future__ import annotations

from pathlib import Path

from edgecore.protocol.device_config import ConfigState, ConfigStatus
from edgecore.protocol.reports import Birth, DeviceState
from edgectl.controller.store import SqliteStore
from tests.fleet import EdgectlHome


def test_device_config_commands(tmp_path: Path) -> None:
    home = EdgectlHome(tmp_path / "home", "mqtt://127.0.0.1:1")
    home.path.mkdir()
    store = SqliteStore(home.path / "controller.db")
    store.upsert_device("cam-1", birth=Birth("cam-1"), birth_at=1.0)

    bad = home.edgectl("device", "config", "set", "cam-1", "--set", "inference.max_queue=-1")
    assert bad.returncode == 2 and bad.stderr.startswith("error: settings.inference.max_queue: -1 is outside"), bad.stderr
    bad = home.edgectl("device", "config", "set", "cam-1", "--set", "colour")
    assert (bad.returncode, bad.stderr.count("\n")) == (2, 1) and bad.stderr.startswith("error: --set[0]: 'colour'")
    assert store.device_config("cam-1") is None, "a refused config was stored"

    home.edgectl("device", "config", "set", "cam-1", "-s", "telemetry_interval_s=30", "-s", "log_level=debug",
                 "--tag", "line=3", check=True)
    desired = store.device_config("cam-1")
    assert desired is not None and desired.version == 1
    assert desired.settings.to_json() == {"telemetry_interval_s": 30, "log_level": "DEBUG", "tags": {"line": "3"}}

    status = ConfigStatus(1, ConfigState.APPLIED, "", 1)
    store.upsert_device("cam-1", state=DeviceState("cam-1", config=status), state_at=2.0)
    shown = home.edgectl("device", "config", "show", "cam-1", check=True).stdout.splitlines()
    assert shown[-2:] == ["reported: v1 applied; in force: v1", "sync: in sync"], shown
    assert [a.actor.startswith("cli:") for a in store.audit_log(device_id="cam-1") if a.action == "device config set"] \
        == [True]


def test_a_devices_own_windows_from_the_cli_bad_ones_named(tmp_path: Path) -> None:
    home = EdgectlHome(tmp_path / "home", "mqtt://127.0.0.1:1")
    home.path.mkdir()
    store = SqliteStore(home.path / "controller.db")
    store.upsert_device("cam-1", birth=Birth("cam-1"), birth_at=1.0)
    bad = home.edgectl("device", "config", "set", "cam-1", "--window", "daily 02:00-04:00", "--window", "weekly")
    assert bad.returncode == 2 and bad.stderr.startswith("error: settings.maintenance_windows[1]: 'weekly'"), bad.stderr
    assert store.device_config("cam-1") is None, "a refused config was stored"
    home.edgectl("device", "config", "set", "cam-1", "--window", "sat,sun 00:00-24:00", check=True)
    desired = store.device_config("cam-1")
    assert desired is not None and desired.settings.maintenance_windows == ("Sat-Sun 00:00-24:00",)
