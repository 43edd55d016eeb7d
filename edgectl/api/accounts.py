"""Users, their bearer tokens and who is calling: shared by ``edgectl users|tokens`` and the REST API.

Tokens are 32 random bytes; the store keeps their SHA-256 only, so a leaked store does not leak a
usable token. A request's token is found by its id (the part after ``edgectl_``) and its hash
compared in constant time. Every change is audited with its actor.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from edgecore.errors import NotFoundError, UserError
from edgectl.controller.accounts import ROLES, Role, TokenRow, UserRow
from edgectl.controller.store import Store

__all__ = ["MAX_TOKEN_DAYS", "Accounts", "NameTaken", "Principal", "hash_token", "parse_role"]

PREFIX = "edgectl_"
MAX_TOKEN_DAYS = 3650  # the longest lifetime a token may be given; none at all is asked for by giving none
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")
_TOKEN = re.compile(r"^edgectl_([0-9a-f]{12})_([A-Za-z0-9_-]{43})$")


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def parse_role(text: str) -> Role:
    try:
        return Role(text)
    except ValueError:
        raise UserError(f"role {text!r}: expected one of {', '.join(r.value for r in ROLES)}") from None


class NameTaken(UserError):
    """A user of that name exists already (the API answers 409)."""


@dataclass(frozen=True)
class Principal:
    """Who a request comes from: a user, its role and the token it used."""

    user: str
    role: Role
    token_id: str

    @property
    def actor(self) -> str:
        """How the audit log names this caller."""
        return f"api:{self.user}"


class Accounts:
    """User and token management on a store; ``clock`` is a seam for expiry tests."""

    def __init__(self, store: Store, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.clock = clock

    # -- users ------------------------------------------------------------------------------------

    def add_user(self, name: str, role: Role, actor: str) -> UserRow:
        if not _NAME.match(name):
            raise UserError(f"user name {name!r}: use 1-64 letters, digits, '.', '_', '@' or '-', "
                            "starting with a letter or digit")
        user = UserRow(name, role, self.clock())
        if not self.store.add_user(user):
            raise NameTaken(f"user {name!r} exists already (see `edgectl users list`)")
        self.store.audit("user added", f"{name} as {role}", actor=actor)
        return user

    def users(self) -> list[UserRow]:
        return self.store.users()

    def remove_user(self, name: str, actor: str) -> None:
        if not self.store.remove_user(name, self.clock()):
            raise NotFoundError(f"no user {name!r} (see `edgectl users list`)")
        self.store.audit("user removed", f"{name} (its tokens revoked)", actor=actor)

    # -- tokens -----------------------------------------------------------------------------------

    def create_token(self, user: str, name: str, expires_s: float | None, actor: str) -> tuple[TokenRow, str]:
        """A new token for ``user``: (its row, the token itself, shown once and never stored)."""
        if self.store.user(user) is None:
            raise NotFoundError(f"no user {user!r}: add it first with `edgectl users add {user} --role viewer`")
        if expires_s is not None and not 0 < expires_s <= MAX_TOKEN_DAYS * 86400.0:  # NaN fails both comparisons
            raise UserError(f"token expiry must be a positive duration of at most {MAX_TOKEN_DAYS} days "
                            "(no expiry: give none)")
        token_id = secrets.token_hex(6)
        token = f"{PREFIX}{token_id}_{secrets.token_urlsafe(32)}"
        now = self.clock()
        row = TokenRow(token_id, user, name, hash_token(token), now, now + expires_s if expires_s else None)
        self.store.add_token(row)
        self.store.audit("token created", f"{token_id} for {user}" + (f" ({name})" if name else ""), actor=actor)
        return row, token

    def tokens(self, user: str | None = None) -> list[TokenRow]:
        return self.store.tokens(user)

    def revoke_token(self, token_id: str, actor: str) -> None:
        if not self.store.revoke_token(token_id, self.clock()):
            raise NotFoundError(f"no active token {token_id!r} (see `edgectl tokens list`)")
        self.store.audit("token revoked", token_id, actor=actor)

    # -- requests ---------------------------------------------------------------------------------

    def authenticate(self, authorization: str | None) -> Principal | None:
        """The caller an ``Authorization: Bearer ...`` header proves, or None (missing, wrong, revoked, expired)."""
        scheme, _, token = (authorization or "").partition(" ")
        match = _TOKEN.match(token.strip()) if scheme.lower() == "bearer" else None
        if match is None:
            return None
        row = self.store.token(match.group(1))
        if row is None or not hmac.compare_digest(row.sha256, hash_token(token.strip())):
            return None
        if row.revoked is not None or (row.expires is not None and row.expires <= self.clock()):
            return None
        user = self.store.user(row.user)
        return Principal(user.name, user.role, row.id) if user is not None else None
