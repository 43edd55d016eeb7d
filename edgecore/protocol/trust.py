"""The keys this device trusts: pinned in its config, moved on by rotations signed with a trusted key.

A key rotation is a DSSE envelope of type ``KEY_ROTATION_TYPE`` carried on the commands topic. It
names a role (``package`` or ``controller``), new public keys to trust and key ids to retire, and a
version that must grow. It is accepted only when a key of that role that the device trusts now
signed it, so only the holder of the old key can move a fleet to a new one; accepted rotations are
persisted in ``<state>/trust.json`` so they survive restarts.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgecore.durable import atomic_write_json, read_json
from edgecore.errors import ConfigError, OperationFailed, ProtocolError, VerificationError
from edgecore.protocol.envelope import KEY_ROTATION_TYPE, Envelope, TrustedKeys, key_id, load_public_key, sign
from edgecore.protocol.schema import decode_json, encode_json

__all__ = ["ROLES", "KeyRotation", "RoleTrust", "TrustStore"]

ROLES = ("package", "controller")


@dataclass(frozen=True)
class KeyRotation:
    """Trust ``new_keys`` (PEM) for ``role`` and stop trusting the key ids in ``retire``."""

    role: str
    version: int
    issued_at: float
    new_keys: tuple[str, ...]
    retire: tuple[str, ...] = ()

    def to_payload(self) -> bytes:
        return encode_json({"type": "key-rotation", "role": self.role, "version": self.version,
                            "issued_at": self.issued_at, "new_keys": list(self.new_keys), "retire": list(self.retire)})

    @classmethod
    def from_payload(cls, raw: bytes) -> KeyRotation:
        f = decode_json(raw, "key-rotation")
        if f.text("type", 32) != "key-rotation":
            raise ProtocolError("key-rotation: type must be 'key-rotation'")
        role = f.text("role", 32)
        if role not in ROLES:
            raise ProtocolError(f"key-rotation: unknown role {role!r} (roles: {', '.join(ROLES)})")
        new_keys = tuple(str(k) for k in f.array("new_keys", 8))
        for pem in new_keys:
            load_public_key(pem)
        return cls(role, f.integer("version", 1), f.number("issued_at"), new_keys, tuple(str(k) for k in f.array("retire", 16)))

    def sign(self, old_key: Ed25519PrivateKey) -> Envelope:
        return sign(KEY_ROTATION_TYPE, self.to_payload(), old_key)


@dataclass(frozen=True)
class RoleTrust:
    """What rotations changed for one role: the accepted version, keys added since the pins, key ids retired."""

    version: int = 0
    added: tuple[str, ...] = ()  # PEM public keys
    retired: tuple[str, ...] = ()  # key ids

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "added": list(self.added), "retired": list(self.retired)}

    @classmethod
    def from_dict(cls, data: Any) -> RoleTrust:
        """Read the saved form; a damaged entry raises ConfigError (the device must not silently forget a rotation)."""
        if not isinstance(data, dict):
            raise ConfigError(f"trust state: expected an object per role, got {type(data).__name__}")
        version, added, retired = data.get("version", 0), data.get("added", []), data.get("retired", [])
        if isinstance(version, bool) or not isinstance(version, int) or not _strings(added) or not _strings(retired):
            raise ConfigError("trust state: version must be an integer, added and retired lists of strings")
        return cls(version, tuple(added), tuple(retired))

    def rotated(self, rotation: KeyRotation) -> RoleTrust:
        """This role after ``rotation``: its keys added, the retired ones dropped."""
        kept = tuple(p for p in self.added if key_id(load_public_key(p)) not in rotation.retire)
        return RoleTrust(rotation.version, kept + rotation.new_keys, tuple(sorted({*self.retired, *rotation.retire})))


class TrustStore:
    """Pinned PEMs per role plus the accepted rotations."""

    def __init__(self, state_dir: Path, package_pems: list[str], controller_pems: list[str]) -> None:
        self.path = state_dir / "trust.json"
        self._pinned = {"package": package_pems, "controller": controller_pems}
        self._lock = threading.Lock()
        saved = read_json(self.path) or {}
        if not isinstance(saved, dict):
            raise ConfigError(f"{self.path}: expected a JSON object")
        self._state = {role: RoleTrust.from_dict(saved.get(role, {})) for role in ROLES}

    def keys(self, role: str) -> TrustedKeys:
        return self._keys(role, self._state[role])

    def _keys(self, role: str, trust: RoleTrust) -> TrustedKeys:
        keys = [load_public_key(p) for p in [*self._pinned[role], *trust.added]]
        return TrustedKeys([k for k in keys if key_id(k) not in trust.retired])

    def _verified(self, envelope: Envelope) -> KeyRotation:
        """The rotation, once a key trusted for the role it names has signed it (parsed only then)."""
        refusals: dict[str, str] = {}
        for role in ROLES:
            try:
                payload = self.keys(role).verify(envelope, KEY_ROTATION_TYPE)
            except VerificationError as exc:
                refusals[role] = str(exc)
                continue
            rotation = KeyRotation.from_payload(payload)
            if rotation.role != role:
                raise VerificationError(f"rotation of {rotation.role} keys signed by a {role} key")
            return rotation
        reasons = set(refusals.values())
        if len(reasons) == 1:  # every role refused it for one reason (an untrusted key, another payload type): that one
            raise VerificationError(f"key rotation: {reasons.pop()}")
        raise VerificationError("key rotation: " + "; ".join(f"{role} keys: {why}" for role, why in refusals.items()))

    def apply(self, envelope: Envelope, now: float | None = None) -> KeyRotation:
        """Accept a rotation signed by a key trusted now for its role; raise VerificationError otherwise."""
        rotation = self._verified(envelope)
        role = rotation.role
        with self._lock:
            current = self._state[role]
            if rotation.version <= current.version:
                raise VerificationError(f"stale key rotation: version {rotation.version} <= accepted {current.version}")
            if rotation.issued_at > (now or time.time()) + 300:
                raise VerificationError("key rotation issued in the future")
            after = current.rotated(rotation)
            if not self._keys(role, after).ids():
                raise VerificationError("key rotation would leave no trusted key")  # never lock the device out
            state = {**self._state, role: after}
            try:
                atomic_write_json(self.path, {r: t.to_dict() for r, t in state.items()})
            except OSError as exc:
                raise OperationFailed(f"cannot save the key rotation: {exc.strerror or exc}") from exc
            self._state = state
        return rotation


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)
