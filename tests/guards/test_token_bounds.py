"""A token's lifetime is bounded at 3650 days (ten years), pinned here as a number so that moving the bound is a
deliberate change, not a slip. ./scripts/mutants runs this for edgectl/api/accounts.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgecore.errors import UserError
from edgectl.api.accounts import Accounts
from edgectl.controller.accounts import Role
from edgectl.controller.store import SqliteStore


def test_a_token_may_live_3650_days_and_not_a_day_more(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "store.db")
    try:
        accounts = Accounts(store)
        accounts.add_user("v", Role.VIEWER, "test")
        row, _ = accounts.create_token("v", "", 3650 * 86400.0, "test")
        assert row.expires is not None and row.expires - row.created == 3650 * 86400.0
        with pytest.raises(UserError, match="at most 3650 days"):
            accounts.create_token("v", "", 3651 * 86400.0, "test")
    finally:
        store.close()
