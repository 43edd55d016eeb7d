"""Signing keys on the workstation: one active ed25519 key per role, older ones kept for rotation.

Layout: ``$EDGECTL_HOME/keys/<role>/<key-id>.key`` (PKCS8 PEM, mode 0600) and ``<key-id>.pub``,
with ``<role>/active`` naming the key that signs. Roles: ``package`` signs manifests,
``controller`` signs desired states and commands.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgecore.durable import atomic_write
from edgecore.errors import ConfigError, NotFoundError
from edgecore.protocol.envelope import TrustedKeys, key_id, load_public_key, public_key_pem
from edgectl.home import edgectl_home

__all__ = ["ROLES", "Keyring"]

ROLES = ("package", "controller")


class Keyring:
    def __init__(self, root: Path | None = None) -> None:
        self.root = root or edgectl_home() / "keys"

    def _dir(self, role: str) -> Path:
        if role not in ROLES:
            raise ConfigError(f"unknown key role {role!r} (roles: {', '.join(ROLES)})")
        return self.root / role

    def init(self, role: str) -> tuple[str, bool]:
        """Create the role's first key unless it has one; return (key id, created)."""
        active = self._active_id(role)
        if active is not None:
            return active, False
        return self._generate(role), True

    def rotate(self, role: str) -> str:
        """Make a new active key; the old one stays listed so agents can be moved over."""
        return self._generate(role)

    def _generate(self, role: str) -> str:
        directory = self._dir(role)
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        key = Ed25519PrivateKey.generate()
        kid = key_id(key.public_key())
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        path = directory / f"{kid}.key"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
        (directory / f"{kid}.pub").write_text(public_key_pem(key.public_key()))
        atomic_write(directory / "active", kid.encode())
        return kid

    def _active_id(self, role: str) -> str | None:
        try:
            return (self._dir(role) / "active").read_text().strip() or None
        except FileNotFoundError:
            return None

    def signing_key(self, role: str) -> Ed25519PrivateKey:
        kid = self._active_id(role)
        if kid is None:
            raise NotFoundError(f"no {role} signing key yet: run `edgectl keys init`")
        key = serialization.load_pem_private_key((self._dir(role) / f"{kid}.key").read_bytes(), None)
        if not isinstance(key, Ed25519PrivateKey):
            raise ConfigError(f"{role} key {kid} is not ed25519")
        return key

    def public_pem(self, role: str, kid: str | None = None) -> str:
        kid = kid or self._active_id(role)
        path = self._dir(role) / f"{kid}.pub"
        if kid is None or not path.exists():
            raise NotFoundError(f"no {role} key {kid or ''}: see `edgectl keys list`".replace("  ", " "))
        return path.read_text()

    def trusted(self, role: str) -> TrustedKeys:
        """Every public key of ``role`` in this keyring (active and rotated-out), as a verifier."""
        keys = [load_public_key(self.public_pem(role, r["key_id"])) for r in self.list() if r["role"] == role]
        if not keys:
            raise NotFoundError(f"no {role} key yet: run `edgectl keys init`")
        return TrustedKeys(keys)

    def list(self) -> list[dict[str, Any]]:
        rows = []
        for role in ROLES:
            active = self._active_id(role)
            for pub in sorted(self._dir(role).glob("*.pub")) if self._dir(role).exists() else []:
                rows.append({
                    "role": role, "key_id": pub.stem, "active": pub.stem == active,
                    "created": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(pub.stat().st_mtime)),
                })
        return rows
