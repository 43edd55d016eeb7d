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

from agent.durable import atomic_write_json, read_json
from agent.errors import ProtocolError, VerificationError
from agent.protocol.envelope import KEY_ROTATION_TYPE, Envelope, TrustedKeys, key_id, load_public_key, sign
from agent.protocol.schema import decode_json, encode_json

__all__ = ["ROLES", "KeyRotation", "TrustStore"]

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

    def sign(self, old_key: object) -> Envelope:
        return sign(KEY_ROTATION_TYPE, self.to_payload(), old_key)  # type: ignore[arg-type]


class TrustStore:
    """Pinned PEMs per role plus the accepted rotations."""

    def __init__(self, state_dir: Path, package_pems: list[str], controller_pems: list[str]) -> None:
        self.path = state_dir / "trust.json"
        self._pinned = {"package": package_pems, "controller": controller_pems}
        self._lock = threading.Lock()
        saved = read_json(self.path) or {}
        self._state: dict[str, dict[str, object]] = {
            role: {"version": 0, "added": [], "retired": [], **saved.get(role, {})} for role in ROLES
        }

    def keys(self, role: str) -> TrustedKeys:
        state = self._state[role]
        pems = [*self._pinned[role], *state["added"]]  # type: ignore[misc]
        keys = [load_public_key(p) for p in pems]
        return TrustedKeys([k for k in keys if key_id(k) not in state["retired"]])  # type: ignore[operator]

    def _verified(self, envelope: Envelope) -> KeyRotation:
        """The rotation, once a key trusted for the role it names has signed it (parsed only then)."""
        for role in ROLES:
            try:
                payload = self.keys(role).verify(envelope, KEY_ROTATION_TYPE)
            except VerificationError:
                continue
            rotation = KeyRotation.from_payload(payload)
            if rotation.role != role:
                raise VerificationError(f"rotation of {rotation.role} keys signed by a {role} key")
            return rotation
        signers = ", ".join(kid for kid, _ in envelope.signatures) or "nobody"
        raise VerificationError(f"key rotation signed only by untrusted key(s) {signers}")

    def apply(self, envelope: Envelope, now: float | None = None) -> KeyRotation:
        """Accept a rotation signed by a key trusted now for its role; raise VerificationError otherwise."""
        rotation = self._verified(envelope)
        role = rotation.role
        with self._lock:
            state = self._state[role]
            if rotation.version <= int(state["version"]):  # type: ignore[call-overload]
                raise VerificationError(f"stale key rotation: version {rotation.version} <= accepted {state['version']}")
            if rotation.issued_at > (now or time.time()) + 300:
                raise VerificationError("key rotation issued in the future")
            added = [p for p in state["added"] if key_id(load_public_key(p)) not in rotation.retire]  # type: ignore[attr-defined]
            self._state[role] = {"version": rotation.version, "added": added + list(rotation.new_keys),
                                 "retired": sorted({*state["retired"], *rotation.retire})}  # type: ignore[misc]
            if not self.keys(role).ids():
                self._state[role] = state
                raise VerificationError("key rotation would leave no trusted key")  # never lock the device out
            atomic_write_json(self.path, self._state)
        return rotation
