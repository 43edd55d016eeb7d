"""The device side's checks of what the controller sends (edgecore.protocol.intake), shared by the agent and
the light simulated agents: versions compared as numbers, the refusals of a verified manifest, and the
signature, type, address, sequence and expiry of desired states and commands."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgecore import __version__
from edgecore.errors import ProtocolError, VerificationError
from edgecore.protocol.envelope import COMMAND_TYPE, DESIRED_TYPE, MANIFEST_TYPE, Envelope, TrustedKeys, sign
from edgecore.protocol.intake import Intake, refusal, version_key
from edgecore.protocol.ledger import Ledger
from edgecore.protocol.manifest import FileEntry, Manifest, PayloadInfo, TargetInfo
from edgecore.protocol.messages import Command, DesiredModel, DesiredState

SHA = "ab" * 32
MANIFEST = Manifest(name="m", version=3, created_at=1.0, expires_at=time.time() + 3600, min_agent_version=__version__,
                    target=TargetInfo("jetson-orin", device_classes=("jetson",)), payload=PayloadInfo(10, SHA, 1024, (SHA,)),
                    files=(FileEntry("model.onnx", 10, SHA, "model"),), model="model.onnx", inputs=(), outputs=())


@pytest.mark.parametrize("older, newer", [
    ("0.9.1", "0.10.0"), ("0.1.0", "0.1.1"), ("1.99.99", "2"), ("1.0rc1", "1.0"), ("1.0.dev3", "1.0.0"), ("0.1", "0.1.0.1"),
])
def test_versions_compare_as_numbers(older: str, newer: str) -> None:
    assert version_key(older) < version_key(newer)


def test_trailing_zeros_do_not_count_and_junk_is_refused() -> None:
    assert version_key("1") == version_key("1.0") == version_key("1.0.0")
    for junk in ("", "v1.0", "latest", ".1"):
        with pytest.raises(ProtocolError, match="expected numbers separated by dots"):
            version_key(junk)


def test_a_manifest_needing_a_newer_agent_is_refused_in_one_line_naming_both_versions(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path)
    needs = dataclasses.replace(MANIFEST, min_agent_version="0.10.0")
    reason = refusal(needs, ledger, "jetson-orin", False, "0.9.1")
    assert reason == "m v3 needs agent 0.10.0 or newer; this agent is 0.9.1"
    assert refusal(needs, ledger, "jetson-orin", False, "0.10.0") is None
    assert refusal(needs, ledger, "jetson-orin", False, "0.10.1") is None
    junk = refusal(dataclasses.replace(MANIFEST, min_agent_version="soon"), ledger, "jetson-orin", False, "0.1.0")
    assert junk is not None and junk.startswith("min_agent_version of m v3: version 'soon'") and "\n" not in junk


def test_the_other_refusals_of_a_verified_manifest(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path)
    assert refusal(MANIFEST, ledger, "jetson", False, "0.1.0") is None  # a device class the target lists
    expired = dataclasses.replace(MANIFEST, expires_at=1.0)
    assert refusal(expired, ledger, "jetson-orin", False, "0.1.0") == "manifest of m v3 has expired"
    assert refusal(MANIFEST, ledger, "cpu-x86", False, "0.1.0") == "package is for target 'jetson-orin', this device is 'cpu-x86'"
    ledger.commit_version("m", 4)
    assert refusal(MANIFEST, ledger, "jetson-orin", False, "0.1.0") == "version 3 of m is older than the accepted 4"
    assert refusal(MANIFEST, ledger, "jetson-orin", True, "0.1.0") is None


class Controller:
    """Signs what a controller sends one device, with a package key for the manifests."""

    def __init__(self) -> None:
        self.key, self.package_key = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
        self.keys = {"controller": TrustedKeys([self.key.public_key()]), "package": TrustedKeys([self.package_key.public_key()])}

    def desired(self, seq: int, device: str = "cam-1", name: str = "m", expires_in: float = 60.0,
                payload_type: str = DESIRED_TYPE) -> bytes:
        model = DesiredModel(name, MANIFEST.version, sign(MANIFEST_TYPE, MANIFEST.to_bytes(), self.package_key))
        now = time.time()
        desired = DesiredState(device, seq, now, now + expires_in, "d-1", model)
        return sign(payload_type, desired.to_payload(), self.key).to_bytes()

    def command(self, seq: int) -> bytes:
        now = time.time()
        return sign(COMMAND_TYPE, Command("cam-1", seq, now, now + 60, "rollback").to_payload(), self.key).to_bytes()


def test_a_desired_state_passes_every_check_and_the_caller_moves_the_sequence_on(tmp_path: Path) -> None:
    controller, ledger = Controller(), Ledger(tmp_path)
    intake = Intake("cam-1", ledger, controller.keys.__getitem__)
    order = intake.desired(controller.desired(5), retained=False)
    assert order is not None and order.manifest == MANIFEST and order.desired.seq == 5 and ledger.last_seq == 0
    ledger.accept_seq(5)
    assert intake.desired(controller.desired(5), retained=True) is None  # handed back on a reconnect: done already
    with pytest.raises(VerificationError, match="stale or replayed"):
        intake.desired(controller.desired(5), retained=False)


@pytest.mark.parametrize("how, error, match", [
    ("another device", VerificationError, "addressed to cam-2"),
    ("expired", VerificationError, "expired"),
    ("the command type", VerificationError, "payload type"),
    ("another model", ProtocolError, "different model than its signed manifest"),
])
def test_a_desired_state_is_refused(tmp_path: Path, how: str, error: type[Exception], match: str) -> None:
    controller, ledger = Controller(), Ledger(tmp_path)
    raw = {"another device": lambda: controller.desired(7, device="cam-2"),
           "expired": lambda: controller.desired(7, expires_in=-1.0),
           "the command type": lambda: controller.desired(7, payload_type=COMMAND_TYPE),  # correctly signed, wrong type
           "another model": lambda: controller.desired(7, name="other")}[how]()
    with pytest.raises(error, match=match):
        Intake("cam-1", ledger, controller.keys.__getitem__).desired(raw, retained=False)
    # A manifest refused for good moves the sequence on: its replay is refused as a replay.
    assert ledger.last_seq == (7 if how == "another model" else 0)


def test_a_command_is_checked_like_a_desired_state(tmp_path: Path) -> None:
    controller, ledger = Controller(), Ledger(tmp_path)
    intake = Intake("cam-1", ledger, controller.keys.__getitem__)
    assert intake.command(Envelope.from_bytes(controller.command(9))).command == "rollback"
    ledger.accept_seq(9)
    with pytest.raises(VerificationError, match="stale or replayed"):
        intake.command(Envelope.from_bytes(controller.command(9)))
    with pytest.raises(VerificationError, match="payload type"):
        intake.command(Envelope.from_bytes(controller.desired(10)))
