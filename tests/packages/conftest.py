"""An edgectl home with signing keys and no broker: package commands fail (or succeed) before any network."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fleet import EdgectlHome


@pytest.fixture
def offline_home(tmp_path: Path) -> EdgectlHome:
    home = EdgectlHome(tmp_path / "home", "mqtt://127.0.0.1:1")  # no broker: inputs fail before connecting
    home.path.mkdir()
    home.init_keys()
    return home
