"""Fuzzing that asserts the refusal, and its class: what must be refused is refused, the rest accepted.

``tests/security/test_fuzz.py`` shows that readers never crash on hostile bytes. Here each property
has an oracle: a tampered signed envelope always raises VerificationError; a controller message
with one field of the wrong type, range or shape always raises ProtocolError naming that field;
the address, sequence and expiry checks refuse exactly the messages the rules refuse; a manifest
that breaks one rule always raises ProtocolError; the ledger and the key rotations never go back.
Bounded (a few seconds); ``EDGE_FUZZ_EXAMPLES`` raises the count as in the other fuzz tests.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgecore.errors import OperationFailed, ProtocolError, VerificationError
from edgecore.protocol.envelope import COMMAND_TYPE, DESIRED_TYPE, KEY_ROTATION_TYPE, MANIFEST_TYPE, Envelope, TrustedKeys, sign
from edgecore.protocol.ledger import Ledger
from edgecore.protocol.manifest import FileEntry, Manifest, PayloadInfo, TargetInfo
from edgecore.protocol.messages import Command, DesiredState, check_addressed

EXAMPLES = int(os.environ.get("EDGE_FUZZ_EXAMPLES", "100"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
KEY, STRANGER = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
TRUSTED = TrustedKeys([KEY.public_key()])
TYPES = [DESIRED_TYPE, COMMAND_TYPE, MANIFEST_TYPE, KEY_ROTATION_TYPE]


# -- signed envelopes ---------------------------------------------------------------------------------------


def _flip(data: bytes, at: int) -> bytes:
    at %= len(data)
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1:]


TAMPERS = ["payload", "signature", "type", "keyid", "unsigned", "stranger", "stranger-keyid"]


@FUZZ
@given(payload=st.binary(min_size=1, max_size=200), kind=st.sampled_from(TYPES), tamper=st.sampled_from(TAMPERS),
       at=st.integers(0, 1 << 16), other=st.sampled_from([*TYPES, "", "application/json"]))
def test_any_tampering_with_a_signed_envelope_is_a_verification_error(payload: bytes, kind: str, tamper: str, at: int,
                                                                       other: str) -> None:
    envelope = Envelope.from_bytes(sign(kind, payload, KEY).to_bytes())
    assert TRUSTED.verify(envelope, kind) == payload
    (kid, sig), = envelope.signatures
    stranger = sign(kind, payload, STRANGER).signatures[0]
    tampered = {
        "payload": Envelope(kind, _flip(payload, at), envelope.signatures),
        "signature": Envelope(kind, payload, ((kid, _flip(sig, at)),)),
        "type": Envelope(other if other != kind else kind + "+x", payload, envelope.signatures),
        "keyid": Envelope(kind, payload, ((kid[::-1] if kid[::-1] != kid else "0" * 16, sig),)),
        "unsigned": Envelope(kind, payload, ()),
        "stranger": Envelope(kind, payload, (stranger,)),
        "stranger-keyid": Envelope(kind, payload, ((kid, stranger[1]),)),  # a trusted key's id on another's signature
    }[tamper]
    with pytest.raises(VerificationError):
        TRUSTED.verify(Envelope.from_bytes(tampered.to_bytes()), kind)


# -- controller messages: one field wrong --------------------------------------------------------------------

NOT_AN_ID = st.sampled_from(["", "a/b", "+", "#", "../x", ".hidden", "-x", "_x", "a b", "é", "x" * 65]) | st.integers() \
    | st.none() | st.booleans() | st.lists(st.text(max_size=3), max_size=2)
NOT_A_SEQ = st.sampled_from([0, -1, 2**63, True, False, 1.5, "7", None, [1]]) | st.integers(max_value=0)
NOT_A_NUMBER: st.SearchStrategy[Any] = st.sampled_from([True, "1", None, [], {}, 10**400, math.nan, math.inf, -math.inf])
WRONG = {  # field -> values it never takes (None: the field is missing)
    "type": st.sampled_from(["", "Desired", "command ", None, 1, "x" * 40]),
    "device_id": NOT_AN_ID,
    "seq": NOT_A_SEQ,
    "issued_at": NOT_A_NUMBER,
    "expires_at": NOT_A_NUMBER,
    "deployment_id": NOT_AN_ID,
    "model": st.sampled_from(["m", 1, [], True, {}, {"name": "m"}, {"name": "m", "version": 0, "manifest": {}}]),
    "options": st.sampled_from(["x", 1, [], True, {"shadow": 1}, {"shadow": {"min_agreement": 1.5}},
                                {"shadow": {"min_agreement": True}}, {"shadow": {}}]),
    "command": st.sampled_from(["reboot", "", "Rollback", None, 7, "x" * 40]),
    "args": st.sampled_from(["x", 1, [], True]),
    "schema": st.sampled_from([0, 2, "1", True, None, 1.0]),
}


def _desired() -> dict[str, Any]:
    desired = DesiredState("dev-1", 5, 1.0, 2.0, "d-1", None, {"shadow": {"min_agreement": 0.5}})
    data: dict[str, Any] = json.loads(desired.to_payload())
    return data


def _command() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(Command("dev-1", 5, 1.0, 2.0, "report", {"x": 1}).to_payload())
    return data


READERS = {"desired": (_desired, DesiredState.from_payload, ["type", "device_id", "seq", "issued_at", "expires_at",
                                                               "deployment_id", "model", "options", "schema"]),
           "command": (_command, Command.from_payload, ["type", "device_id", "seq", "issued_at", "expires_at", "command",
                                                         "args", "schema"])}


@FUZZ
@given(reader=st.sampled_from(sorted(READERS)), data=st.data())
def test_a_controller_message_with_one_wrong_field_is_a_protocol_error(reader: str, data: st.DataObject) -> None:
    valid, parse, fields = READERS[reader]
    message = valid()
    parse(json.dumps(message).encode())  # the unbroken message reads
    field = data.draw(st.sampled_from(fields))
    value = data.draw(WRONG[field])
    if value is None and field != "model":
        message.pop(field)
    else:
        message[field] = value
    with pytest.raises(ProtocolError):
        parse(json.dumps(message).encode())


@pytest.mark.parametrize(("field", "limit"), [("device_id", 64), ("deployment_id", 64)])
def test_ids_are_read_up_to_their_limit(field: str, limit: int) -> None:
    message = _desired()
    message[field] = "a" * limit
    assert getattr(DesiredState.from_payload(json.dumps(message).encode()), field) == "a" * limit


def test_the_type_field_names_the_message() -> None:
    desired, command = _desired(), _command()
    desired["type"], command["type"] = "command", "desired"
    with pytest.raises(ProtocolError, match="desired: type must be 'desired'"):
        DesiredState.from_payload(json.dumps(desired).encode())
    with pytest.raises(ProtocolError, match="command: type must be 'command'"):
        Command.from_payload(json.dumps(command).encode())


# -- address, sequence and expiry ---------------------------------------------------------------------------


@FUZZ
@given(device=st.sampled_from(["dev-1", "dev-2"]), seq=st.integers(1, 50), last=st.integers(0, 50),
       expires=st.floats(0, 100), now=st.floats(0.001, 100), kind=st.sampled_from(["desired", "command"]))
def test_a_message_is_refused_exactly_when_misaddressed_replayed_or_expired(device: str, seq: int, last: int,
                                                                            expires: float, now: float, kind: str) -> None:
    message: DesiredState | Command = (DesiredState(device, seq, 0.0, expires, "d", None) if kind == "desired"
                                       else Command(device, seq, 0.0, expires, "report"))
    refused = device != "dev-1" or seq <= last or now > expires
    if refused:
        with pytest.raises(VerificationError):
            check_addressed(message, "dev-1", last, now)
    else:
        check_addressed(message, "dev-1", last, now)


def test_expiry_is_read_against_the_clock_when_no_time_is_given() -> None:
    with pytest.raises(VerificationError, match="expired at"):
        check_addressed(Command("dev-1", 2, 0.0, time.time() - 5, "report"), "dev-1", 1)
    check_addressed(Command("dev-1", 2, 0.0, time.time() + 60, "report"), "dev-1", 1)


# -- manifests: one chunk hash per chunk ----------------------------------------------------------------------

SHA = "ab" * 32


def _manifest(size: int, chunk_size: int) -> dict[str, Any]:
    payload = PayloadInfo(size, SHA, chunk_size, (SHA,) * -(-size // chunk_size))
    manifest = Manifest("m", 1, 1.0, 2e9, "0.1", TargetInfo("any"), payload, (FileEntry("model.onnx", 10, SHA, "model"),),
                        "model.onnx", (), ())
    data: dict[str, Any] = json.loads(manifest.to_bytes())
    return data


@FUZZ
@given(size=st.integers(1, 10**7), chunk_size=st.integers(1024, 64 * 1024 * 1024), skew=st.integers(-2, 2))
def test_a_manifest_needs_exactly_one_chunk_hash_per_chunk(size: int, chunk_size: int, skew: int) -> None:
    data = _manifest(size, chunk_size)
    count = len(data["payload"]["chunks"])
    assert count == math.ceil(size / chunk_size)
    data["payload"]["chunks"] = [SHA] * max(0, count + skew)
    if count + skew == count:
        assert Manifest.from_bytes(json.dumps(data).encode()).payload.size == size
    else:
        with pytest.raises(ProtocolError, match="chunk hashes for"):
            Manifest.from_bytes(json.dumps(data).encode())


# -- what the device accepted never goes back ------------------------------------------------------------------


@FUZZ
@given(seqs=st.lists(st.integers(0, 1000), max_size=12), versions=st.lists(st.tuples(st.sampled_from("ab"), st.integers(0, 9)),
                                                                          max_size=8))
def test_the_ledger_keeps_the_highest_sequence_and_versions_across_restarts(tmp_path_factory: pytest.TempPathFactory,
                                                                            seqs: list[int],
                                                                            versions: list[tuple[str, int]]) -> None:
    state = tmp_path_factory.mktemp("ledger")
    ledger = Ledger(state)
    assert (ledger.last_seq, ledger.version("a")) == (0, 0)
    for seq in seqs:
        ledger.accept_seq(seq)
    for name, version in versions:
        ledger.commit_version(name, version)
    again = Ledger(Path(state))
    for reader in (ledger, again):
        assert reader.last_seq == max(seqs, default=0)
        for name in "ab":
            assert reader.version(name) == max((v for n, v in versions if n == name), default=0)


def test_a_ledger_that_cannot_be_saved_keeps_what_it_had(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path)
    ledger.accept_seq(5)
    (tmp_path / "ledger.json").unlink()
    (tmp_path / "ledger.json").mkdir()  # where the file goes: every write fails
    with pytest.raises(OperationFailed, match="cannot save the ledger"):
        ledger.accept_seq(9)
    with pytest.raises(OperationFailed, match="cannot save the ledger"):
        ledger.commit_version("a", 3)
    assert (ledger.last_seq, ledger.version("a")) == (5, 0)


def test_a_desired_state_may_be_8_mib_and_no_larger() -> None:
    text = json.dumps(_desired())
    at_limit = text[:-1] + " " * (8 * 1024 * 1024 - len(text)) + "}"
    assert DesiredState.from_payload(at_limit.encode()).seq == 5
    with pytest.raises(ProtocolError, match="exceeds the 8388608 byte limit"):
        DesiredState.from_payload((at_limit + " ").encode())
    command = json.dumps(_command())
    with pytest.raises(ProtocolError, match="exceeds the 1048576 byte limit"):
        Command.from_payload((command[:-1] + " " * (1024 * 1024 - len(command) + 1) + "}").encode())
