"""The fleet PKI on disk: CA, controller identity, enrollment bundles, revocation list."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ed25519
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from agent.config import load_agent_config  # the agent's own loader must read what enroll writes
from edgecore.errors import ConfigError, NotFoundError, ProtocolError, UserError
from edgectl.pki import Algorithm, BundleTrust, FleetPki, enroll_device, parse_tags


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _cn(cert: x509.Certificate) -> str:
    return str(cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("algorithm", list(Algorithm))
def test_init_creates_ca_controller_and_empty_crl(tmp_path: Path, algorithm: Algorithm) -> None:
    pki = FleetPki.init(tmp_path / "pki", algorithm)
    ca, controller = _cert(pki.ca_cert_path), _cert(pki.controller_cert_path)
    controller.verify_directly_issued_by(ca)
    assert _cn(controller) == "controller"
    assert ExtendedKeyUsageOID.CLIENT_AUTH in controller.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert pki.algorithm is algorithm and pki.revoked() == {}
    assert _mode(pki.root) == 0o700
    assert _mode(pki.ca_key_path) == _mode(pki.controller_key_path) == 0o600


def test_init_never_overwrites_a_ca(tmp_path: Path) -> None:
    pki = FleetPki.init(tmp_path, Algorithm.P256)
    before = pki.ca_cert_path.read_bytes()
    with pytest.raises(UserError, match="already exists"):
        FleetPki.init(tmp_path, Algorithm.ED25519)
    assert pki.ca_cert_path.read_bytes() == before


def test_enroll_writes_a_bundle_the_agent_loads(tmp_path: Path) -> None:
    pki = FleetPki.init(tmp_path / "pki", Algorithm.P256)
    signer = tmp_path / "package-signer.pub"
    signer.write_bytes(pki.ca_cert_path.read_bytes())  # any file stands in for a public key here
    out = tmp_path / "cam-1"
    enroll_device(pki, "cam-1", out, "mqtts://broker.lan:8883", {"site": "lyon"}, 30, BundleTrust(packages=[signer]))

    raw = yaml.safe_load((out / "agent.yaml").read_text())
    assert raw == {
        "device_id": "cam-1",
        "broker": "mqtts://broker.lan:8883",
        "tls": {"ca": "ca.pem", "cert": "device.pem", "key": "device.key"},
        "tags": {"site": "lyon"},
        "trust": {"packages": ["trust/packages-0.pem"]},
    }
    assert _mode(out / "device.key") == 0o600
    cert = _cert(out / "device.pem")
    cert.verify_directly_issued_by(_cert(out / "ca.pem"))
    assert _cn(cert) == "cam-1" and cert == _cert(pki.device_cert_path("cam-1"))
    config = load_agent_config(out / "agent.yaml")
    assert config.tls.key == out / "device.key" and config.tags == {"site": "lyon"}


@pytest.mark.parametrize("device_id, error", [("controller", UserError), ("../etc", ProtocolError),
                                              ("a/b", ProtocolError), ("+", ProtocolError)])
def test_enroll_refuses_unsafe_or_reserved_ids(tmp_path: Path, device_id: str, error: type[Exception]) -> None:
    pki = FleetPki.init(tmp_path / "pki", Algorithm.P256)
    with pytest.raises(error):
        enroll_device(pki, device_id, tmp_path / "out", "mqtts://h:8883", {}, 30)
    assert not (tmp_path / "out").exists()


def test_bad_inputs_are_refused_before_a_certificate_is_issued(tmp_path: Path) -> None:
    pki = FleetPki.init(tmp_path / "pki", Algorithm.P256)
    with pytest.raises(ConfigError, match="mqtts://"):
        enroll_device(pki, "cam-1", tmp_path / "out", "mqtt://broker:1883", {}, 30)
    with pytest.raises(ConfigError, match="does not exist"):
        enroll_device(pki, "cam-1", tmp_path / "out", "mqtts://b", {}, 30, BundleTrust(packages=[tmp_path / "nope.pem"]))
    assert not pki.device_cert_path("cam-1").exists()


def test_reenroll_needs_force_which_revokes_the_old_certificate(tmp_path: Path) -> None:
    pki = FleetPki.init(tmp_path / "pki", Algorithm.P256)
    enroll_device(pki, "cam-1", tmp_path / "one", "mqtts://b", {}, 30)
    old = _cert(pki.device_cert_path("cam-1")).serial_number
    with pytest.raises(UserError, match="already enrolled"):
        enroll_device(pki, "cam-1", tmp_path / "two", "mqtts://b", {}, 30)
    enroll_device(pki, "cam-1", tmp_path / "two", "mqtts://b", {}, 30, force=True)
    assert pki.is_revoked(old)
    assert not pki.is_revoked(_cert(pki.device_cert_path("cam-1")).serial_number)


def test_revoke_updates_crl_and_every_registered_broker_copy(tmp_path: Path) -> None:
    pki = FleetPki.init(tmp_path / "pki", Algorithm.ED25519)
    pki.enroll("cam-1", 30)
    pki.add_crl_target(tmp_path / "broker" / "crl.pem")
    number_before = pki.crl().extensions.get_extension_for_class(x509.CRLNumber).value.crl_number

    assert pki.revoke("cam-1") is True
    assert pki.revoke("cam-1") is False  # idempotent
    serial = _cert(pki.device_cert_path("cam-1")).serial_number
    copy = x509.load_pem_x509_crl((tmp_path / "broker" / "crl.pem").read_bytes())
    assert copy.get_revoked_certificate_by_serial_number(serial) is not None
    ca_key = _cert(pki.ca_cert_path).public_key()
    assert isinstance(ca_key, ed25519.Ed25519PublicKey)
    assert copy.is_signature_valid(ca_key)
    assert copy.extensions.get_extension_for_class(x509.CRLNumber).value.crl_number > number_before

    pki.refresh_crl()
    assert pki.is_revoked(serial)
    with pytest.raises(NotFoundError):
        pki.revoke("never-enrolled")


def test_open_without_init_says_what_to_run(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError, match="edgectl pki init"):
        FleetPki.open(tmp_path)


def test_parse_tags() -> None:
    assert parse_tags("site=lyon, line=3,") == {"site": "lyon", "line": "3"}
    assert parse_tags("") == {}
    with pytest.raises(ConfigError, match="key=value"):
        parse_tags("site")
