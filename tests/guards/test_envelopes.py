"""Signed envelopes at every reader: the right key on the wrong payload type is refused, and says so.

DSSE signs the payload type with the payload, so a desired state cannot pass as a command, nor a
command as a key rotation, even when the key that signed it is trusted for both. Each reader is
presented with a correctly signed envelope of every other type: the device's desired-state and
command topics (a real agent on the in-memory broker), the manifest inside a desired state, the
key rotations, and the host's package reader. A declared type the reader does not take is a
VerificationError naming both types; the reader's own type over another message's body is a
ProtocolError (the signature holds, the contract does not).
"""

from __future__ import annotations

import base64
import hashlib
import json
import tarfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ec import SECP256R1, generate_private_key
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agent.config import AgentConfig, InferenceSettings, TrustSettings
from agent.daemon import Agent
from edgecore.errors import PackageError, ProtocolError, VerificationError
from edgecore.protocol import topics
from edgecore.protocol.envelope import (
    COMMAND_TYPE,
    DESIRED_TYPE,
    KEY_ROTATION_TYPE,
    MANIFEST_TYPE,
    MAX_ENVELOPE_BYTES,
    Envelope,
    TrustedKeys,
    key_id,
    load_public_key,
    pae,
    public_key_pem,
    sign,
)
from edgecore.protocol.manifest import FileEntry, Manifest, PayloadInfo, TargetInfo
from edgecore.protocol.messages import Command, DesiredModel, DesiredState, verify_signed
from edgecore.protocol.reports import DeviceEvent
from edgecore.protocol.trust import KeyRotation, TrustStore
from edgecore.transport_memory import MemoryBroker, MemoryTransport
from edgectl.package import read_package

DEVICE = "dev-1"
TYPES = [DESIRED_TYPE, COMMAND_TYPE, MANIFEST_TYPE, KEY_ROTATION_TYPE, "application/json"]
SHORT = {DESIRED_TYPE: "desired", COMMAND_TYPE: "command", MANIFEST_TYPE: "manifest", KEY_ROTATION_TYPE: "rotation",
         "application/json": "json"}


def _others(kind: str) -> list[str]:
    return [t for t in TYPES if t != kind]


def _wrong_type(reader: str, declared: str) -> str:
    return f"payload type {declared!r} is not the expected {reader!r}"


# -- the verifier every reader goes through ---------------------------------------------------------------


@pytest.mark.parametrize("expected", TYPES, ids=[SHORT[t] for t in TYPES])
def test_a_verifier_takes_only_the_type_it_expects(expected: str) -> None:
    key = Ed25519PrivateKey.generate()
    trusted = TrustedKeys([key.public_key()])
    assert trusted.verify(sign(expected, b"{}", key), expected) == b"{}"
    for declared in _others(expected):
        envelope = sign(declared, b"{}", key)
        with pytest.raises(VerificationError) as caught:
            trusted.verify(envelope, expected)
        assert str(caught.value) == _wrong_type(expected, declared)
        with pytest.raises(VerificationError, match="payload type"):
            verify_signed(envelope.to_bytes(), trusted, expected)


def test_the_signature_covers_the_type() -> None:
    key = Ed25519PrivateKey.generate()
    signed = sign(COMMAND_TYPE, b"{}", key)
    relabelled = Envelope(DESIRED_TYPE, signed.payload, signed.signatures)
    with pytest.raises(VerificationError, match=f"bad signature by key {key_id(key.public_key())}"):
        TrustedKeys([key.public_key()]).verify(relabelled, DESIRED_TYPE)
    assert pae(COMMAND_TYPE, b"{}") == b"DSSEv1 %d %s 2 {}" % (len(COMMAND_TYPE), COMMAND_TYPE.encode())


def test_signatures_are_tried_until_a_trusted_key_answers() -> None:
    good, stranger = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    trusted = TrustedKeys([good.public_key()])
    first, second = sign(MANIFEST_TYPE, b"{}", stranger), sign(MANIFEST_TYPE, b"{}", good)
    both = Envelope(MANIFEST_TYPE, b"{}", first.signatures + second.signatures)
    assert trusted.verify(both, MANIFEST_TYPE) == b"{}"
    forged = Envelope(MANIFEST_TYPE, b"{}", ((second.signatures[0][0], first.signatures[0][1]), *second.signatures))
    with pytest.raises(VerificationError, match="bad signature"):  # a trusted key's bad signature is final
        trusted.verify(forged, MANIFEST_TYPE)
    with pytest.raises(VerificationError, match=f"signed only by untrusted key.s. {key_id(stranger.public_key())}$"):
        trusted.verify(first, MANIFEST_TYPE)
    with pytest.raises(VerificationError, match="the envelope carries no signature"):
        trusted.verify(Envelope(MANIFEST_TYPE, b"{}", ()), MANIFEST_TYPE)


def test_trusted_keys_are_added_and_listed_by_id() -> None:
    a, b = Ed25519PrivateKey.generate().public_key(), Ed25519PrivateKey.generate().public_key()
    keys = TrustedKeys([a])
    keys.add(b)
    assert keys.ids() == sorted([key_id(a), key_id(b)]) and all(len(k) == 16 for k in keys.ids())
    assert load_public_key(public_key_pem(b)).public_bytes_raw() == b.public_bytes_raw()


def test_only_ed25519_public_keys_are_trusted() -> None:
    with pytest.raises(VerificationError, match="not a PEM public key"):
        load_public_key("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n")
    ec = generate_private_key(SECP256R1()).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    with pytest.raises(VerificationError, match="trusted keys must be ed25519"):
        load_public_key(ec)


# -- the envelope's own shape ----------------------------------------------------------------------------------


def _raw(size: int) -> bytes:
    """A well-formed, unsigned envelope padded with spaces to exactly ``size`` bytes."""
    body = b'{"payloadType": "t", "payload": "e30=", "signatures": []'
    return body + b" " * (size - len(body) - 1) + b"}"


def test_an_envelope_over_the_size_limit_is_refused_unread() -> None:
    assert Envelope.from_bytes(_raw(MAX_ENVELOPE_BYTES)).payload == b"{}"
    with pytest.raises(ProtocolError, match=f"envelope: {MAX_ENVELOPE_BYTES + 1} bytes exceeds the {MAX_ENVELOPE_BYTES}"):
        Envelope.from_bytes(_raw(MAX_ENVELOPE_BYTES + 1))
    assert MAX_ENVELOPE_BYTES == 4 * 1024 * 1024


def test_at_most_sixteen_signatures() -> None:
    sig = {"keyid": "k", "sig": "AAAA"}
    sixteen = Envelope.from_json({"payloadType": "t", "payload": "", "signatures": [sig] * 16})
    assert len(sixteen.signatures) == 16 and sixteen.signatures[0] == ("k", b"\0\0\0")
    with pytest.raises(ProtocolError, match="at most 16 entries"):
        Envelope.from_json({"payloadType": "t", "payload": "", "signatures": [sig] * 17})
    assert Envelope.from_json({"payloadType": "t", "payload": ""}).signatures == ()


ENVELOPES = [  # a JSON value, the one-line reason
    ([], "expected a JSON object"),
    ({"payload": ""}, "missing field 'payloadType'"),
    ({"payloadType": "t"}, "missing field 'payload'"),
    ({"payloadType": 7, "payload": ""}, "payloadType must be a string"),
    ({"payloadType": "t", "payload": 7}, "payload must be a base64 string"),
    ({"payloadType": "t", "payload": "e3 0="}, "payload is not valid base64"),
    ({"payloadType": "t", "payload": "e30"}, "payload is not valid base64"),
    ({"payloadType": "t", "payload": "", "signatures": {}}, "signatures must be a list"),
    ({"payloadType": "t", "payload": "", "signatures": ["k"]}, "each signature needs a string keyid"),
    ({"payloadType": "t", "payload": "", "signatures": [{"keyid": 1, "sig": ""}]}, "each signature needs a string keyid"),
    ({"payloadType": "t", "payload": "", "signatures": [{"keyid": "k"}]}, "sig must be a base64 string"),
    ({"payloadType": "t", "payload": "", "signatures": [{"keyid": "k", "sig": "!!"}]}, "sig is not valid base64"),
]


@pytest.mark.parametrize(("value", "reason"), ENVELOPES, ids=[r for _, r in ENVELOPES])
def test_a_malformed_envelope_is_a_protocol_error_naming_the_fault(value: object, reason: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        Envelope.from_bytes(json.dumps(value).encode())
    assert str(caught.value) == f"envelope: {reason}" or str(caught.value).startswith(f"envelope: {reason}")


@pytest.mark.parametrize(("raw", "reason"), [(b"{nope", "not JSON"), (b"\xff\xfe", "not JSON"),
                                             (b"[" * 100_000 + b"]" * 100_000, "JSON nested too deeply")])
def test_bytes_that_are_not_json_are_a_protocol_error(raw: bytes, reason: str) -> None:
    with pytest.raises(ProtocolError, match=f"envelope: {reason}"):
        Envelope.from_bytes(raw)


# -- key rotations ---------------------------------------------------------------------------------------------


def test_a_rotation_under_another_type_is_refused_and_trust_is_unchanged(tmp_path: Path) -> None:
    old, new = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    store = TrustStore(tmp_path, [public_key_pem(old.public_key())], [public_key_pem(Ed25519PrivateKey.generate().public_key())])
    rotation = KeyRotation("package", 1, time.time(), (public_key_pem(new.public_key()),), (key_id(old.public_key()),))
    for declared in _others(KEY_ROTATION_TYPE):
        with pytest.raises(VerificationError) as caught:
            store.apply(sign(declared, rotation.to_payload(), old))
        assert str(caught.value) == f"key rotation: {_wrong_type(KEY_ROTATION_TYPE, declared)}"
    assert store.keys("package").ids() == [key_id(old.public_key())] and not (tmp_path / "trust.json").exists()
    with pytest.raises(ProtocolError, match="key-rotation: type must be 'key-rotation'"):  # signed as one, not one
        store.apply(sign(KEY_ROTATION_TYPE, Command(DEVICE, 1, 0.0, 1.0, "report").to_payload(), old))
    store.apply(rotation.sign(old))
    assert store.keys("package").ids() == [key_id(new.public_key())]


# -- the host's package reader ---------------------------------------------------------------------------------


def _package(path: Path, declared: str, key: Ed25519PrivateKey) -> None:
    payload = path.parent / "payload.tar"
    with tarfile.open(payload, "w") as tar:
        tar.addfile(tarfile.TarInfo("empty"))
    data = payload.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    chunks = tuple(hashlib.sha256(data[i:i + 1024]).hexdigest() for i in range(0, len(data), 1024))
    manifest = Manifest("m", 1, 1.0, 4e9, "0.1", TargetInfo("any"), PayloadInfo(len(data), sha, 1024, chunks),
                        (FileEntry("empty", 0, hashlib.sha256(b"").hexdigest(), "model"),), "empty", (), ())
    (path.parent / "envelope.json").write_bytes(sign(declared, manifest.to_bytes(), key).to_bytes())
    with tarfile.open(path, "w") as tar:
        tar.add(path.parent / "envelope.json", "envelope.json")
        tar.add(payload, "payload.tar")


@pytest.mark.parametrize("declared", _others(MANIFEST_TYPE), ids=[SHORT[t] for t in _others(MANIFEST_TYPE)])
def test_the_package_reader_refuses_a_manifest_signed_as_another_type(tmp_path: Path, declared: str) -> None:
    key = Ed25519PrivateKey.generate()
    (tmp_path / "work").mkdir()
    _package(tmp_path / "p.edgepkg", declared, key)
    with pytest.raises(VerificationError, match=_wrong_type(MANIFEST_TYPE, declared).replace("+", r"\+")):
        read_package(tmp_path / "p.edgepkg", TrustedKeys([key.public_key()]), tmp_path / "work")
    assert list((tmp_path / "work").iterdir()) == []  # refused before a byte of payload was written
    _package(tmp_path / "p.edgepkg", MANIFEST_TYPE, key)
    assert read_package(tmp_path / "p.edgepkg", TrustedKeys([key.public_key()]), tmp_path / "work").manifest.name == "m"
    with pytest.raises(PackageError, match="over the limit of 10"):
        read_package(tmp_path / "p.edgepkg", TrustedKeys([key.public_key()]), tmp_path / "work", max_bytes=10)


# -- the device: a real agent on the in-memory broker -------------------------------------------------------


@dataclass
class Device:
    agent: Agent
    controller: MemoryTransport
    events: MemoryTransport
    controller_key: Ed25519PrivateKey
    package_key: Ed25519PrivateKey
    seq: int = 100

    def present(self, leaf: str, envelope: Envelope) -> DeviceEvent:
        """Publish ``envelope`` on the device's ``leaf`` topic; the event the device answers with."""
        self.controller.publish(topics.device(DEVICE, leaf), envelope.to_bytes(), qos=1)
        deadline = time.monotonic() + 10
        while True:
            message = self.events.inbox.get(timeout=max(0.0, deadline - time.monotonic()))
            if message.topic == topics.device(DEVICE, "events"):
                return DeviceEvent.from_payload(message.payload)

    def desired(self, model: DesiredModel | None = None) -> bytes:
        self.seq += 1
        now = time.time()
        return DesiredState(DEVICE, self.seq, now, now + 600, "d-1", model, {}).to_payload()

    def command(self) -> bytes:
        self.seq += 1
        now = time.time()
        return Command(DEVICE, self.seq, now, now + 600, "report").to_payload()


def _pem(key: Ed25519PrivateKey, path: Path) -> Path:
    path.write_text(public_key_pem(key.public_key()))
    return path


@pytest.fixture(scope="module")
def device(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Device]:
    """One agent for the module: every message here is refused, so none changes what the next test sees."""
    tmp = tmp_path_factory.mktemp("device")
    controller_key, package_key = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    (tmp / "hw").mkdir()
    config = AgentConfig(DEVICE, state_dir=tmp / "state", hardware_root=tmp / "hw", telemetry_interval_s=3600.0,
                         trust=TrustSettings([_pem(package_key, tmp / "package.pem")], [_pem(controller_key, tmp / "c.pem")]),
                         inference=InferenceSettings(port=0))
    broker = MemoryBroker()
    events = broker.transport("observer")
    events.subscribe(topics.device(DEVICE, "events"))
    events.subscribe(topics.device(DEVICE, "presence"))
    events.connect()
    controller = broker.transport("controller")
    controller.connect()
    agent = Agent(config, transport=broker.factory(f"edge-agent-{DEVICE}"))
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    assert events.inbox.get(timeout=60).topic == topics.device(DEVICE, "presence")  # connected: it takes messages now
    yield Device(agent, controller, events, controller_key, package_key)
    agent.stop()
    thread.join(10)


def _refused(device: Device, leaf: str, envelope: Envelope, kind: type[Exception], reason: str) -> None:
    before, last_seq = device.agent.rejected[kind.__name__], device.agent.ledger.last_seq
    event = device.present(leaf, envelope)
    assert (event.state, event.status) == ("rejected", "rejected") and reason in event.detail, event.detail
    assert device.agent.rejected[kind.__name__] == before + 1
    assert device.agent.ledger.last_seq == last_seq  # nothing accepted, nothing to replay against


@pytest.mark.parametrize("declared", _others(DESIRED_TYPE), ids=[SHORT[t] for t in _others(DESIRED_TYPE)])
def test_the_desired_state_topic_refuses_other_types(device: Device, declared: str) -> None:
    envelope = sign(declared, device.desired(), device.controller_key)
    _refused(device, "desired", envelope, VerificationError, _wrong_type(DESIRED_TYPE, declared))


@pytest.mark.parametrize("declared", [DESIRED_TYPE, MANIFEST_TYPE, "application/json"], ids=["desired", "manifest", "json"])
def test_the_command_topic_refuses_other_types(device: Device, declared: str) -> None:
    envelope = sign(declared, device.command(), device.controller_key)
    _refused(device, "commands", envelope, VerificationError, _wrong_type(COMMAND_TYPE, declared))


def test_a_command_signed_as_a_key_rotation_is_not_a_rotation(device: Device) -> None:
    envelope = sign(KEY_ROTATION_TYPE, device.command(), device.controller_key)
    _refused(device, "commands", envelope, ProtocolError, "key-rotation: type must be 'key-rotation'")


def test_a_rotation_signed_as_a_command_is_not_a_command(device: Device) -> None:
    rotation = KeyRotation("controller", 1, time.time(), (public_key_pem(Ed25519PrivateKey.generate().public_key()),))
    _refused(device, "commands", sign(COMMAND_TYPE, rotation.to_payload(), device.controller_key), ProtocolError,
             "command: type must be 'command'")
    assert len(device.agent.trust.keys("controller").ids()) == 1


@pytest.mark.parametrize("declared", _others(MANIFEST_TYPE), ids=[SHORT[t] for t in _others(MANIFEST_TYPE)])
def test_a_desired_state_whose_manifest_is_signed_as_another_type_is_refused(device: Device, declared: str) -> None:
    manifest = sign(declared, base64.b64decode("e30="), device.package_key)
    desired = sign(DESIRED_TYPE, device.desired(DesiredModel("m", 1, manifest)), device.controller_key)
    event = device.present("desired", desired)
    assert (event.state, event.status) == ("rejected", "rejected")
    assert _wrong_type(MANIFEST_TYPE, declared) in event.detail
    assert device.agent.ledger.last_seq == device.seq  # refused for good: a replay of it is refused as a replay
