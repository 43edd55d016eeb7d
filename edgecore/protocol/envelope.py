"""DSSE envelopes signed with ed25519: how manifests and controller commands are signed.

The signature covers the exact payload bytes and their type through DSSE's pre-authentication
encoding (PAE), so a payload cannot be replayed under another type (a manifest as a command).
Nothing inside the payload is parsed before a trusted signature over it has been checked.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from edgecore.errors import ProtocolError, VerificationError, listing

__all__ = [
    "COMMAND_TYPE",
    "DESIRED_TYPE",
    "KEY_ROTATION_TYPE",
    "MANIFEST_TYPE",
    "Envelope",
    "TrustedKeys",
    "key_id",
    "load_public_key",
    "pae",
    "public_key_pem",
    "sign",
]

MANIFEST_TYPE = "application/vnd.edgectl.manifest.v1+json"
DESIRED_TYPE = "application/vnd.edgectl.desired.v1+json"
COMMAND_TYPE = "application/vnd.edgectl.command.v1+json"
KEY_ROTATION_TYPE = "application/vnd.edgectl.key-rotation.v1+json"

MAX_ENVELOPE_BYTES = 4 * 1024 * 1024


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding."""
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


def key_id(public_key: Ed25519PublicKey) -> str:
    """Short stable id of a public key: first 16 hex digits of sha256 over its raw bytes."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def public_key_pem(public_key: Ed25519PublicKey) -> str:
    return public_key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode()


def load_public_key(pem: str | bytes) -> Ed25519PublicKey:
    """Parse a PEM ed25519 public key; raise VerificationError for anything else."""
    try:
        key = serialization.load_pem_public_key(pem.encode() if isinstance(pem, str) else pem)
    except (ValueError, TypeError) as exc:
        raise VerificationError(f"not a PEM public key: {exc}") from exc
    if not isinstance(key, Ed25519PublicKey):
        raise VerificationError("trusted keys must be ed25519")
    return key


@dataclass(frozen=True)
class Envelope:
    """A DSSE envelope: payload bytes, their type, and signatures over PAE(type, payload)."""

    payload_type: str
    payload: bytes
    signatures: tuple[tuple[str, bytes], ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "payloadType": self.payload_type,
            "payload": base64.b64encode(self.payload).decode(),
            "signatures": [
                {"keyid": kid, "sig": base64.b64encode(sig).decode()} for kid, sig in self.signatures
            ],
        }

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_json(), separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: Any) -> Envelope:
        """Read the envelope structure only; the payload stays opaque bytes."""
        if not isinstance(data, Mapping):
            raise ProtocolError("envelope: expected a JSON object")
        try:
            payload_type = data["payloadType"]
            payload = _b64(data["payload"], "payload")
            sigs = data.get("signatures", [])
        except KeyError as exc:
            raise ProtocolError(f"envelope: missing field {exc.args[0]!r}") from exc
        if not isinstance(payload_type, str):
            raise ProtocolError("envelope: payloadType must be a string")
        if not isinstance(sigs, list) or len(sigs) > 16:
            raise ProtocolError("envelope: signatures must be a list of at most 16 entries")
        parsed = []
        for sig in sigs:
            if not isinstance(sig, Mapping) or not isinstance(sig.get("keyid"), str):
                raise ProtocolError("envelope: each signature needs a string keyid")
            parsed.append((sig["keyid"], _b64(sig.get("sig"), "sig")))
        return cls(payload_type, payload, tuple(parsed))

    @classmethod
    def from_bytes(cls, raw: bytes) -> Envelope:
        if len(raw) > MAX_ENVELOPE_BYTES:
            raise ProtocolError(f"envelope: {len(raw)} bytes exceeds the {MAX_ENVELOPE_BYTES} byte limit")
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ProtocolError(f"envelope: not JSON ({exc})") from exc
        except RecursionError as exc:  # deeply nested JSON
            raise ProtocolError("envelope: JSON nested too deeply") from exc
        return cls.from_json(data)


def _b64(value: Any, what: str) -> bytes:
    if not isinstance(value, str):
        raise ProtocolError(f"envelope: {what} must be a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ProtocolError(f"envelope: {what} is not valid base64") from exc


def sign(payload_type: str, payload: bytes, key: Ed25519PrivateKey) -> Envelope:
    """Sign ``payload`` as ``payload_type`` with one key."""
    sig = key.sign(pae(payload_type, payload))
    return Envelope(payload_type, payload, ((key_id(key.public_key()), sig),))


class TrustedKeys:
    """The public keys a verifier trusts, by key id."""

    def __init__(self, keys: list[Ed25519PublicKey]) -> None:
        self._keys = {key_id(k): k for k in keys}

    def ids(self) -> list[str]:
        return sorted(self._keys)

    def add(self, key: Ed25519PublicKey) -> None:
        self._keys[key_id(key)] = key

    def verify(self, envelope: Envelope, expected_type: str) -> bytes:
        """Return the payload if a trusted key signed it as ``expected_type``; else raise."""
        if envelope.payload_type != expected_type:
            raise VerificationError(
                f"payload type {envelope.payload_type!r} is not the expected {expected_type!r}"
            )
        if not envelope.signatures:
            raise VerificationError("the envelope carries no signature")
        message = pae(envelope.payload_type, envelope.payload)
        unknown = []
        for kid, sig in envelope.signatures:
            key = self._keys.get(kid)
            if key is None:
                unknown.append(kid)
                continue
            try:
                key.verify(sig, message)
                return envelope.payload
            except InvalidSignature:
                raise VerificationError(f"bad signature by key {kid}") from None
        raise VerificationError(f"signed only by untrusted key(s) {listing(unknown)}")
