"""Key rotations on the device: only a key trusted now for a role moves that role, forward only, never to no key."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgecore.errors import ConfigError, OperationFailed, ProtocolError, VerificationError
from edgecore.protocol.envelope import KEY_ROTATION_TYPE, Envelope, key_id, public_key_pem
from edgecore.protocol.schema import encode_json
from edgecore.protocol.trust import KeyRotation, RoleTrust, TrustStore

NOW = 1_000_000.0


def pem(key: Ed25519PrivateKey) -> str:
    return public_key_pem(key.public_key())


def kid(key: Ed25519PrivateKey) -> str:
    return key_id(key.public_key())


class Device:
    def __init__(self, state: Path) -> None:
        self.state = state
        self.package, self.controller = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
        self.store = self.restart()

    def restart(self) -> TrustStore:
        self.store = TrustStore(self.state, [pem(self.package)], [pem(self.controller)])
        return self.store

    def ids(self, role: str) -> list[str]:
        return self.store.keys(role).ids()


@pytest.fixture
def device(tmp_path: Path) -> Device:
    return Device(tmp_path)


def rotation(role: str, version: int, new: Sequence[Ed25519PrivateKey], retire: Sequence[Ed25519PrivateKey] = (),
             issued_at: float = NOW) -> KeyRotation:
    return KeyRotation(role, version, issued_at, tuple(pem(k) for k in new), tuple(kid(k) for k in retire))


def test_a_rotation_signed_by_the_roles_key_moves_it_and_survives_a_restart(device: Device) -> None:
    new = Ed25519PrivateKey.generate()
    applied = device.store.apply(rotation("package", 1, [new], [device.package]).sign(device.package), now=NOW)
    assert applied.role == "package" and device.ids("package") == [kid(new)]
    assert device.ids("controller") == [kid(device.controller)]
    assert device.restart().keys("package").ids() == [kid(new)]
    newer = Ed25519PrivateKey.generate()
    device.store.apply(rotation("package", 2, [newer], [new]).sign(new), now=NOW)
    assert device.ids("package") == [kid(newer)]
    saved = json.loads((device.state / "trust.json").read_text())
    assert saved["package"] == {"version": 2, "added": [pem(newer)], "retired": sorted([kid(device.package), kid(new)])}


def test_a_rotation_may_add_a_key_beside_the_old_one(device: Device) -> None:
    new = Ed25519PrivateKey.generate()
    device.store.apply(rotation("controller", 1, [new]).sign(device.controller), now=NOW)
    assert device.ids("controller") == sorted([kid(device.controller), kid(new)])


@pytest.mark.parametrize("version", [1, 2])
def test_a_rotation_must_move_forward(device: Device, version: int) -> None:
    device.store.apply(rotation("package", 2, [Ed25519PrivateKey.generate()]).sign(device.package), now=NOW)
    with pytest.raises(VerificationError, match=f"stale key rotation: version {version} <= accepted 2"):
        device.store.apply(rotation("package", version, [Ed25519PrivateKey.generate()]).sign(device.package), now=NOW)
    assert len(device.ids("package")) == 2


def test_a_rotation_issued_more_than_five_minutes_ahead_is_refused(device: Device) -> None:
    with pytest.raises(VerificationError, match="key rotation issued in the future"):
        device.store.apply(rotation("package", 1, [Ed25519PrivateKey.generate()], issued_at=NOW + 300.5).sign(device.package),
                           now=NOW)
    device.store.apply(rotation("package", 1, [Ed25519PrivateKey.generate()], issued_at=NOW + 300).sign(device.package), now=NOW)


def test_without_a_time_the_clock_is_read(device: Device) -> None:
    with pytest.raises(VerificationError, match="in the future"):
        device.store.apply(rotation("package", 1, [Ed25519PrivateKey.generate()], issued_at=4e9).sign(device.package))


def test_a_rotation_that_would_leave_no_key_is_refused(device: Device) -> None:
    with pytest.raises(VerificationError, match="key rotation would leave no trusted key"):
        device.store.apply(rotation("package", 1, [], [device.package]).sign(device.package), now=NOW)
    retired_new = Ed25519PrivateKey.generate()
    with pytest.raises(VerificationError, match="would leave no trusted key"):
        device.store.apply(rotation("package", 1, [retired_new], [device.package, retired_new]).sign(device.package), now=NOW)
    assert device.ids("package") == [kid(device.package)] and not (device.state / "trust.json").exists()


def test_only_a_key_of_the_role_named_may_rotate_it(device: Device) -> None:
    with pytest.raises(VerificationError, match="rotation of controller keys signed by a package key"):
        device.store.apply(rotation("controller", 1, [Ed25519PrivateKey.generate()]).sign(device.package), now=NOW)
    stranger = Ed25519PrivateKey.generate()
    with pytest.raises(VerificationError, match=f"signed only by untrusted key.s. {kid(stranger)}"):
        device.store.apply(rotation("package", 1, [stranger]).sign(stranger), now=NOW)
    with pytest.raises(VerificationError, match="key rotation: the envelope carries no signature"):
        device.store.apply(Envelope(KEY_ROTATION_TYPE, b"{}", ()), now=NOW)
    assert device.ids("controller") == [kid(device.controller)]


def test_a_bad_signature_by_a_trusted_key_is_named_with_each_roles_reason(device: Device) -> None:
    signed = rotation("package", 1, [Ed25519PrivateKey.generate()]).sign(device.package)
    (signer, _sig), = signed.signatures
    forged = Envelope(signed.payload_type, signed.payload, ((signer, bytes(64)),))
    with pytest.raises(VerificationError) as caught:
        device.store.apply(forged, now=NOW)
    assert str(caught.value) == (f"key rotation: package keys: bad signature by key {signer}; "
                                 f"controller keys: signed only by untrusted key(s) {signer}")


def test_a_retired_pinned_key_stays_retired_after_a_restart(device: Device) -> None:
    new = Ed25519PrivateKey.generate()
    device.store.apply(rotation("controller", 1, [new], [device.controller]).sign(device.controller), now=NOW)
    assert device.restart().keys("controller").ids() == [kid(new)]
    with pytest.raises(VerificationError):  # the old key can no longer rotate anything
        device.store.apply(rotation("controller", 2, [Ed25519PrivateKey.generate()]).sign(device.controller), now=NOW)


def test_a_rotation_that_cannot_be_saved_changes_nothing(device: Device) -> None:
    (device.state / "trust.json").mkdir()  # a directory where the file goes: the write fails
    with pytest.raises(OperationFailed, match="cannot save the key rotation"):
        device.store.apply(rotation("package", 1, [Ed25519PrivateKey.generate()]).sign(device.package), now=NOW)
    assert device.ids("package") == [kid(device.package)]


PAYLOADS = [  # a rotation payload's fields changed, the refusal
    ({"type": "rotation"}, "key-rotation: type must be 'key-rotation'"),
    ({"role": "admin"}, "unknown role 'admin' (roles: package, controller)"),
    ({"version": 0}, "key-rotation.version: 0 is outside"),
    ({"new_keys": ["not a key"]}, "not a PEM public key"),
    ({"new_keys": ["k"] * 9}, "key-rotation.new_keys: more than 8 entries"),
    ({"retire": ["k"] * 17}, "key-rotation.retire: more than 16 entries"),
    ({"issued_at": "now"}, "key-rotation.issued_at: expected int or float"),
]


@pytest.mark.parametrize(("change", "refusal"), PAYLOADS, ids=[r for _, r in PAYLOADS])
def test_a_malformed_rotation_is_a_protocol_error(change: dict[str, object], refusal: str) -> None:
    good = json.loads(rotation("package", 1, [Ed25519PrivateKey.generate()]).to_payload())
    assert KeyRotation.from_payload(encode_json({k: v for k, v in good.items() if k != "schema"})).version == 1
    with pytest.raises((ProtocolError, VerificationError), match=re.escape(refusal)):
        KeyRotation.from_payload(json.dumps({**good, **change}).encode())


def test_eight_new_keys_and_sixteen_retired_ids_are_allowed() -> None:
    keys = [Ed25519PrivateKey.generate() for _ in range(8)]
    data = json.loads(rotation("package", 1, keys).to_payload())
    data["retire"] = [f"k{i}" for i in range(16)]
    parsed = KeyRotation.from_payload(json.dumps(data).encode())
    assert len(parsed.new_keys) == 8 and len(parsed.retire) == 16


DAMAGED = [[], {"version": "1"}, {"version": True}, {"added": "pem"}, {"retired": [1]}, {"added": [None]}]


@pytest.mark.parametrize("saved", DAMAGED)
def test_a_damaged_trust_file_is_a_config_error(tmp_path: Path, saved: object) -> None:
    (tmp_path / "trust.json").write_text(json.dumps({"package": saved}))
    with pytest.raises(ConfigError):
        TrustStore(tmp_path, [], [])
    (tmp_path / "trust.json").write_text("[1]")
    with pytest.raises(ConfigError, match="expected a JSON object"):
        TrustStore(tmp_path, [], [])


def test_a_role_with_no_saved_state_starts_at_version_zero() -> None:
    assert RoleTrust.from_dict({}) == RoleTrust() == RoleTrust(0, (), ())
    assert RoleTrust.from_dict({"version": 3, "added": ["p"], "retired": ["k"]}) == RoleTrust(3, ("p",), ("k",))
