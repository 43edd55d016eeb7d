"""Who may use the REST API: users with a role, and the bearer tokens they hold (only hashes kept).

A token reads ``edgectl_<id>_<secret>``: ``id`` (12 hex digits) finds the row, ``secret`` (32 random
bytes, URL-safe base64) is never stored; the row keeps the SHA-256 of the whole token and the
check compares hashes in constant time.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["ROLES", "Role", "TokenRow", "UserRow"]


class Role(str, enum.Enum):
    """What a user may do; each role may do everything the roles before it may."""

    VIEWER = "viewer"  # read everything
    OPERATOR = "operator"  # also upload packages and create and steer rollouts
    ADMIN = "admin"  # also manage users and tokens

    def __str__(self) -> str:
        return str(self.value)

    def allows(self, needed: Role) -> bool:
        return ROLES.index(self) >= ROLES.index(needed)


ROLES = (Role.VIEWER, Role.OPERATOR, Role.ADMIN)


@dataclass(frozen=True)
class UserRow:
    name: str
    role: Role
    created: float

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "role": self.role.value, "created": self.created}


@dataclass(frozen=True)
class TokenRow:
    """A token as the store keeps it: its id, owner and hash; never the secret."""

    id: str
    user: str
    name: str
    sha256: str
    created: float
    expires: float | None = None
    revoked: float | None = None

    def to_dict(self) -> dict[str, object]:
        return {"id": self.id, "user": self.user, "name": self.name, "created": self.created, "expires": self.expires,
                "revoked": self.revoked}
