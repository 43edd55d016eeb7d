"""DSSE envelopes: what a verifier accepts and what it refuses."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgecore.errors import ProtocolError, VerificationError
from edgecore.protocol.envelope import COMMAND_TYPE, MANIFEST_TYPE, Envelope, TrustedKeys, pae, sign


@pytest.fixture
def key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def test_round_trip_through_bytes_verifies(key: Ed25519PrivateKey) -> None:
    envelope = Envelope.from_bytes(sign(MANIFEST_TYPE, b'{"x":1}', key).to_bytes())
    assert TrustedKeys([key.public_key()]).verify(envelope, MANIFEST_TYPE) == b'{"x":1}'


def test_pae_matches_the_dsse_spec() -> None:
    assert pae("http://example.com/HelloWorld", b"hello world") == b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"


@pytest.mark.parametrize("tamper, message", [
    (lambda e: Envelope(e.payload_type, e.payload + b" ", e.signatures), "bad signature"),
    (lambda e: Envelope(COMMAND_TYPE, e.payload, e.signatures), "payload type"),
    (lambda e: Envelope(e.payload_type, e.payload, ()), "no signature"),
])
def test_tampering_is_refused(key: Ed25519PrivateKey, tamper: Callable[[Envelope], Envelope], message: str) -> None:
    envelope = tamper(sign(MANIFEST_TYPE, b"{}", key))
    with pytest.raises(VerificationError, match=message):
        TrustedKeys([key.public_key()]).verify(envelope, MANIFEST_TYPE)


def test_untrusted_key_is_named(key: Ed25519PrivateKey) -> None:
    other = Ed25519PrivateKey.generate()
    with pytest.raises(VerificationError, match="untrusted key"):
        TrustedKeys([key.public_key()]).verify(sign(MANIFEST_TYPE, b"{}", other), MANIFEST_TYPE)


@pytest.mark.parametrize("raw", [b"not json", b"[]", b'{"payloadType": 1, "payload": ""}',
                                 b'{"payloadType": "t", "payload": "!!"}'])
def test_malformed_envelopes_are_protocol_errors(raw: bytes) -> None:
    with pytest.raises(ProtocolError):
        Envelope.from_bytes(raw)
