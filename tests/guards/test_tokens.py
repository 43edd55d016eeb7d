"""Users and bearer tokens: what a token proves, and every way it stops proving it (a real SQLite store, a set clock)."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgecore.errors import NotFoundError, UserError
from edgectl.api.accounts import PREFIX, Accounts, Principal, hash_token, parse_role
from edgectl.controller.accounts import Role
from edgectl.controller.store import SqliteStore


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def accounts(tmp_path: Path) -> Accounts:
    return Accounts(SqliteStore(tmp_path / "store.db"), clock=Clock())


def _clock(accounts: Accounts) -> Clock:
    assert isinstance(accounts.clock, Clock)
    return accounts.clock


def test_a_token_proves_its_user_and_role(accounts: Accounts) -> None:
    accounts.add_user("ops", Role.OPERATOR, "test")
    row, token = accounts.create_token("ops", "ci", None, "test")
    assert token.startswith(PREFIX) and token.split("_")[1] == row.id and len(row.id) == 12
    assert row.sha256 == hash_token(token) != token and row.expires is None
    assert accounts.authenticate(f"Bearer {token}") == Principal("ops", Role.OPERATOR, row.id)
    assert accounts.authenticate(f"bearer {token}  ") == Principal("ops", Role.OPERATOR, row.id)  # scheme in any case
    assert Principal("ops", Role.OPERATOR, row.id).actor == "api:ops"
    _, unnamed = accounts.create_token("ops", "", None, "test")
    details = [e.detail for e in accounts.store.audit_log() if e.action == "token created"]
    assert sorted(details) == sorted([f"{row.id} for ops (ci)", f"{unnamed.split('_')[1]} for ops"])


def test_everything_else_proves_nobody(accounts: Accounts) -> None:
    accounts.add_user("ops", Role.OPERATOR, "test")
    row, token = accounts.create_token("ops", "", None, "test")
    other_row, other = accounts.create_token("ops", "", None, "test")
    secret = token.split("_", 2)[2]
    for header in (None, "", token, f"Basic {token}", f"Bearer{token}", f"Bearer {token}x", f"Bearer {token[:-1]}",
                   f"Bearer edgectl_{row.id}_{other.split('_', 2)[2]}",  # its id with another token's secret
                   f"Bearer edgectl_{'0' * 12}_{secret}", f"Bearer edgectl_{row.id.upper()}_{secret}",
                   f"Bearer {token.replace('edgectl_', 'edgectI_')}"):
        assert accounts.authenticate(header) is None, header
    assert accounts.authenticate(f"Bearer {other}") == Principal("ops", Role.OPERATOR, other_row.id)


def test_a_token_expires_at_its_time_not_after(accounts: Accounts) -> None:
    accounts.add_user("v", Role.VIEWER, "test")
    row, token = accounts.create_token("v", "", 60.0, "test")
    assert row.expires == 1060.0
    clock = _clock(accounts)
    clock.now = 1059.9
    assert accounts.authenticate(f"Bearer {token}") is not None
    clock.now = 1060.0
    assert accounts.authenticate(f"Bearer {token}") is None


def test_a_revoked_token_and_a_removed_users_tokens_prove_nobody(accounts: Accounts) -> None:
    accounts.add_user("a", Role.ADMIN, "test")
    accounts.add_user("b", Role.VIEWER, "test")
    row_a, token_a = accounts.create_token("a", "", None, "test")
    _, token_b = accounts.create_token("b", "", None, "test")
    accounts.revoke_token(row_a.id, "test")
    assert accounts.authenticate(f"Bearer {token_a}") is None
    with pytest.raises(NotFoundError, match=f"no active token {row_a.id!r}"):
        accounts.revoke_token(row_a.id, "test")
    accounts.remove_user("b", "test")
    assert accounts.authenticate(f"Bearer {token_b}") is None
    with pytest.raises(NotFoundError, match="no user 'b'"):
        accounts.remove_user("b", "test")
    assert [u.name for u in accounts.users()] == ["a"]
    actions = [e.action for e in accounts.store.audit_log()]
    assert {"user added", "token created", "token revoked", "user removed"} <= set(actions)


def test_tokens_are_made_only_for_users_and_with_a_positive_expiry(accounts: Accounts) -> None:
    with pytest.raises(NotFoundError, match="no user 'ghost'"):
        accounts.create_token("ghost", "", None, "test")
    accounts.add_user("v", Role.VIEWER, "test")
    for expiry in (0.0, -1.0):
        with pytest.raises(UserError, match="token expiry must be a positive duration"):
            accounts.create_token("v", "", expiry, "test")
    assert accounts.create_token("v", "", 0.001, "test")[0].expires == pytest.approx(1000.001)
    assert len(accounts.tokens("v")) == 1 and accounts.tokens("nobody") == []


@pytest.mark.parametrize("name", ["", ".a", "-a", "a b", "a/b", "a" * 65, "é"])
def test_a_bad_user_name_is_refused(accounts: Accounts, name: str) -> None:
    with pytest.raises(UserError, match="use 1-64 letters"):
        accounts.add_user(name, Role.VIEWER, "test")


def test_user_names_are_unique_and_may_be_64_characters(accounts: Accounts) -> None:
    accounts.add_user("a" * 64, Role.VIEWER, "test")
    accounts.add_user("ci@example.org", Role.VIEWER, "test")
    with pytest.raises(UserError, match="exists already"):
        accounts.add_user("a" * 64, Role.ADMIN, "test")


def test_roles_are_read_by_name() -> None:
    assert [parse_role(r) for r in ("viewer", "operator", "admin")] == [Role.VIEWER, Role.OPERATOR, Role.ADMIN]
    with pytest.raises(UserError, match="role 'root': expected one of viewer, operator, admin"):
        parse_role("root")
