"""The fleet certificate authority on disk: init, enroll, revoke, and the revocation list.

Layout of the PKI directory (mode 0700; private keys 0600)::

    ca.pem ca.key               the fleet CA
    controller.pem controller.key   the controller's client identity (CN=controller)
    crl.pem                     the current revocation list, signed by the CA
    crl-targets.txt             where else crl.pem is copied (one broker crlfile per line)
    devices/<id>.pem            the current certificate of each enrolled device (never its key)
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

# write_file: the project's one atomic writer, re-exported for the PKI's callers (mode 0600 for keys).
from edgecore.durable import atomic_write as write_file
from edgecore.errors import ConfigError, NotFoundError, UserError
from edgecore.protocol.topics import validate_id
from edgectl.pki.certs import Algorithm, PrivateKey, Usage, build_crl, cert_pem, generate_key, issue, key_pem

__all__ = ["CONTROLLER", "FleetPki", "IssuedIdentity", "write_file"]

CONTROLLER = "controller"
# Names a device may not take: the broker ACL grants the controller's rights to this username.
RESERVED_IDS = frozenset({CONTROLLER})
CA_DAYS = 3650
CRL_DAYS = 365


@dataclass(frozen=True)
class IssuedIdentity:
    """A freshly issued certificate and its private key (the key is not kept by the PKI)."""

    name: str
    cert: x509.Certificate
    key: PrivateKey

    @property
    def cert_pem(self) -> bytes:
        return cert_pem(self.cert)

    @property
    def key_pem(self) -> bytes:
        return key_pem(self.key)


def _load_cert(path: Path) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(path.read_bytes())
    except FileNotFoundError:
        raise NotFoundError(f"certificate {path} does not exist") from None
    except ValueError as exc:
        raise ConfigError(f"{path} is not a PEM certificate: {exc}") from None


def _load_key(path: Path) -> PrivateKey:
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except FileNotFoundError:
        raise NotFoundError(f"private key {path} does not exist") from None
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{path} is not an unencrypted PEM private key: {exc}") from None
    if not isinstance(key, (ec.EllipticCurvePrivateKey, ed25519.Ed25519PrivateKey)):
        raise ConfigError(f"{path} holds a {type(key).__name__}: expected an Ed25519 or P-256 key")
    return key


@dataclass(frozen=True)
class FleetPki:
    """A fleet CA kept in one directory."""

    root: Path

    @property
    def ca_cert_path(self) -> Path:
        return self.root / "ca.pem"

    @property
    def ca_key_path(self) -> Path:
        return self.root / "ca.key"

    @property
    def crl_path(self) -> Path:
        return self.root / "crl.pem"

    @property
    def controller_cert_path(self) -> Path:
        return self.root / f"{CONTROLLER}.pem"

    @property
    def controller_key_path(self) -> Path:
        return self.root / f"{CONTROLLER}.key"

    def device_cert_path(self, device_id: str) -> Path:
        return self.root / "devices" / f"{validate_id(device_id)}.pem"

    @classmethod
    def init(cls, root: Path, algorithm: Algorithm) -> FleetPki:
        """Create the CA, the controller identity and an empty CRL; refuse to overwrite a CA."""
        pki = cls(root)
        if pki.ca_cert_path.exists() or pki.ca_key_path.exists():
            raise UserError(f"a fleet CA already exists in {root}: refusing to overwrite it")
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(root, 0o700)
        key = generate_key(algorithm)
        cert = issue("edgectl fleet CA", key, Usage.CA, CA_DAYS)
        write_file(pki.ca_key_path, key_pem(key), 0o600)
        write_file(pki.ca_cert_path, cert_pem(cert))
        controller = pki.issue(CONTROLLER, Usage.CLIENT, CA_DAYS)
        write_file(pki.controller_key_path, controller.key_pem, 0o600)
        write_file(pki.controller_cert_path, controller.cert_pem)
        pki.write_crl([])
        return pki

    @classmethod
    def open(cls, root: Path) -> FleetPki:
        """The PKI in ``root``; NotFoundError if ``edgectl pki init`` has not run there."""
        pki = cls(root)
        if not pki.ca_cert_path.exists():
            raise NotFoundError(f"no fleet CA in {root}: run `edgectl pki init` first")
        return pki

    def ca(self) -> tuple[x509.Certificate, PrivateKey]:
        return _load_cert(self.ca_cert_path), _load_key(self.ca_key_path)

    @property
    def algorithm(self) -> Algorithm:
        key = _load_cert(self.ca_cert_path).public_key()
        return Algorithm.ED25519 if isinstance(key, ed25519.Ed25519PublicKey) else Algorithm.P256

    def issue(self, name: str, usage: Usage, days: int, hosts: Iterable[str] = ()) -> IssuedIdentity:
        """A new key and certificate for ``name`` signed by the CA (nothing is written)."""
        key = generate_key(self.algorithm)
        return IssuedIdentity(name, issue(name, key, usage, days, self.ca(), hosts), key)

    def enroll(self, device_id: str, days: int, force: bool = False) -> IssuedIdentity:
        """Issue a device identity and record its certificate; ``force`` revokes a current one first."""
        validate_id(device_id)
        if device_id in RESERVED_IDS:
            raise UserError(f"device id {device_id!r} is reserved for the controller's identity")
        path = self.device_cert_path(device_id)
        if path.exists() and not self.is_revoked(_load_cert(path).serial_number):
            if not force:
                raise UserError(f"device {device_id!r} is already enrolled: revoke it first or pass --force")
            self.revoke(device_id)
        identity = self.issue(device_id, Usage.CLIENT, days)
        write_file(path, identity.cert_pem)
        return identity

    def revoke(self, device_id: str) -> bool:
        """Add the device's current certificate to the CRL; False if it was already revoked."""
        path = self.device_cert_path(device_id)
        if not path.exists():
            raise NotFoundError(f"device {device_id!r} is not enrolled in {self.root}")
        serial = _load_cert(path).serial_number
        entries = self.revoked()
        if serial in entries:
            return False
        entries[serial] = dt.datetime.now(dt.timezone.utc)
        self.write_crl(entries.items())
        return True

    def crl(self) -> x509.CertificateRevocationList:
        try:
            return x509.load_pem_x509_crl(self.crl_path.read_bytes())
        except FileNotFoundError:
            raise NotFoundError(f"revocation list {self.crl_path} does not exist") from None
        except ValueError as exc:
            raise ConfigError(f"{self.crl_path} is not a PEM CRL: {exc}") from None

    def revoked(self) -> dict[int, dt.datetime]:
        """Serial number -> revocation time of every revoked certificate."""
        return {entry.serial_number: entry.revocation_date_utc for entry in self.crl()}

    def is_revoked(self, serial: int) -> bool:
        return serial in self.revoked()

    def write_crl(self, entries: Iterable[tuple[int, dt.datetime]]) -> list[Path]:
        """Sign a new CRL with ``entries``; write it here and to every registered broker crlfile."""
        number = 1
        if self.crl_path.exists():
            current = self.crl().extensions.get_extension_for_class(x509.CRLNumber).value
            number = current.crl_number + 1
        cert, key = self.ca()
        data = build_crl(cert, key, entries, CRL_DAYS, number).public_bytes(serialization.Encoding.PEM)
        written = [self.crl_path]
        write_file(self.crl_path, data)
        for target in self.crl_targets():
            write_file(target, data)
            written.append(target)
        return written

    def refresh_crl(self) -> list[Path]:
        """Re-sign the CRL with the same entries and a new expiry (run well before next update)."""
        return self.write_crl(self.revoked().items())

    def crl_targets(self) -> list[Path]:
        path = self.root / "crl-targets.txt"
        if not path.exists():
            return []
        return [Path(line) for line in path.read_text().splitlines() if line.strip()]

    def add_crl_target(self, target: Path) -> None:
        """Copy the CRL to ``target`` now and after every revocation (a broker's crlfile)."""
        targets = self.crl_targets()
        target = target.resolve()
        if target not in targets:
            text = "".join(f"{t}\n" for t in [*targets, target])
            write_file(self.root / "crl-targets.txt", text.encode())
        write_file(target, self.crl_path.read_bytes())
