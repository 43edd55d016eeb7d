"""edgecore.tls: the client SSLContext built from an agent config's tls section."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from edgecore.errors import ConfigError
from edgecore.tls import tls_context
from edgectl.pki import Algorithm, FleetPki, enroll_device


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tls")
    pki = FleetPki.init(root / "pki", Algorithm.P256)
    enroll_device(pki, "cam-1", root / "cam-1", "mqtts://localhost:8883", {}, 30)
    return root / "cam-1"


def test_context_verifies_the_broker_and_presents_the_device_cert(bundle: Path) -> None:
    context = tls_context(bundle / "ca.pem", bundle / "device.pem", bundle / "device.key")
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert tls_context(bundle / "ca.pem", None, None).verify_mode == ssl.CERT_REQUIRED


@pytest.mark.parametrize(
    "ca, cert, key, message",
    [
        ("missing.pem", None, None, "tls.ca: .*does not exist"),
        ("device.key", None, None, "tls.ca: .*no usable PEM CA certificate"),
        ("ca.pem", "device.pem", None, "must be given together"),
        ("ca.pem", "missing.pem", "device.key", "tls.cert: .*does not exist"),
        ("ca.pem", "ca.pem", "device.key", "not a matching PEM certificate and key"),
    ],
)
def test_bad_files_raise_one_line_config_errors(bundle: Path, ca: str, cert: str | None, key: str | None,
                                                message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        tls_context(bundle / ca, bundle / cert if cert else None, bundle / key if key else None)
    assert "\n" not in str(info.value)


def test_encrypted_key_is_refused_without_prompting(bundle: Path, tmp_path: Path) -> None:
    key = serialization.load_pem_private_key((bundle / "device.key").read_bytes(), None)
    encrypted = tmp_path / "device.key"
    encrypted.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.BestAvailableEncryption(b"pw")
    ))
    encrypted.chmod(0o600)
    with pytest.raises(ConfigError, match="encrypted"):
        tls_context(bundle / "ca.pem", bundle / "device.pem", encrypted)
