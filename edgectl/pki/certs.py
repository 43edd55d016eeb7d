"""X.509 building blocks of the fleet PKI: keys, certificates and the revocation list."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from enum import Enum
from ipaddress import ip_address

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "Algorithm",
    "PrivateKey",
    "Usage",
    "build_crl",
    "cert_pem",
    "generate_key",
    "issue",
    "key_pem",
]

PrivateKey = ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey

# Certificates are back-dated a little so a device whose clock lags the CA's still accepts them.
_CLOCK_SKEW = dt.timedelta(minutes=5)


class Algorithm(str, Enum):
    """Key algorithm of the fleet CA and everything it issues."""

    P256 = "p256"
    ED25519 = "ed25519"


class Usage(str, Enum):
    """What an issued certificate may be used for; decides its extensions."""

    CA = "ca"
    CLIENT = "client"
    SERVER = "server"


def generate_key(algorithm: Algorithm) -> PrivateKey:
    """A new private key of ``algorithm``."""
    if algorithm is Algorithm.ED25519:
        return ed25519.Ed25519PrivateKey.generate()
    return ec.generate_private_key(ec.SECP256R1())


def _digest(key: PrivateKey) -> hashes.SHA256 | None:
    # Ed25519 signs the message itself; cryptography wants no hash for it.
    return None if isinstance(key, ed25519.Ed25519PrivateKey) else hashes.SHA256()


def key_pem(key: PrivateKey) -> bytes:
    """Unencrypted PKCS#8 PEM of ``key`` (protected by file mode, not a passphrase)."""
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def cert_pem(cert: x509.Certificate) -> bytes:
    """PEM of ``cert``."""
    return cert.public_bytes(serialization.Encoding.PEM)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _san(hosts: Iterable[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def _usage_extensions(builder: x509.CertificateBuilder, usage: Usage) -> x509.CertificateBuilder:
    is_ca = usage is Usage.CA
    builder = builder.add_extension(x509.BasicConstraints(ca=is_ca, path_length=0 if is_ca else None), critical=True)
    builder = builder.add_extension(
        x509.KeyUsage(
            digital_signature=not is_ca, content_commitment=False, key_encipherment=False,
            data_encipherment=False, key_agreement=False, key_cert_sign=is_ca, crl_sign=is_ca,
            encipher_only=False, decipher_only=False,
        ),
        critical=True,
    )
    if usage is Usage.CLIENT:
        builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    elif usage is Usage.SERVER:
        builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    return builder


def issue(
    common_name: str,
    key: PrivateKey,
    usage: Usage,
    days: int,
    issuer: tuple[x509.Certificate, PrivateKey] | None = None,
    hosts: Iterable[str] = (),
) -> x509.Certificate:
    """Certificate for ``key`` with subject CN ``common_name``, signed by ``issuer`` (self if None).

    A client certificate carries only clientAuth and a server certificate only serverAuth, so the
    broker's own certificate can never log in as a device and a device cannot pose as the broker.
    """
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    issuer_name, signer = (subject, key) if issuer is None else (issuer[0].subject, issuer[1])
    now = _now()
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    if issuer is not None:
        ski = issuer[0].extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False
        )
    builder = _usage_extensions(builder, usage)
    hosts = list(hosts)
    if hosts:
        builder = builder.add_extension(_san(hosts), critical=False)
    return builder.sign(signer, _digest(signer))


def build_crl(
    ca_cert: x509.Certificate,
    ca_key: PrivateKey,
    revoked: Iterable[tuple[int, dt.datetime]],
    days: int,
    number: int,
) -> x509.CertificateRevocationList:
    """CRL ``number`` signed by the CA listing ``revoked`` (serial, revocation time), valid ``days``."""
    now = _now()
    ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    builder = (
        x509.CertificateRevocationListBuilder()
        .issuer_name(ca_cert.subject)
        .last_update(now - _CLOCK_SKEW)
        .next_update(now + dt.timedelta(days=days))
        .add_extension(x509.CRLNumber(number), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False)
    )
    for serial, when in revoked:
        entry = x509.RevokedCertificateBuilder().serial_number(serial).revocation_date(when).build()
        builder = builder.add_revoked_certificate(entry)
    return builder.sign(ca_key, _digest(ca_key))
