"""TLS for an MQTT connection: an ssl.SSLContext from the config's CA, cert and key files."""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass
from pathlib import Path

from edgecore.errors import ConfigError

__all__ = ["TlsSettings", "tls_context"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TlsSettings:
    """The ``tls:`` section of a config: CA bundle, client certificate and its key (PEM paths)."""

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None


def _readable(path: Path, what: str) -> Path:
    if not path.is_file():
        raise ConfigError(f"tls.{what}: {path} does not exist or is not a file")
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        raise ConfigError(f"tls.{what}: cannot read {path}: {exc.strerror}") from None
    return path


def _warn_if_exposed(key: Path) -> None:
    # A private key readable by other users lets any local account impersonate this device.
    if key.stat().st_mode & 0o077:
        log.warning("tls.key %s is readable by other users: chmod 600 it", key)


def _encrypted(key: Path) -> bytes:
    raise ConfigError(f"tls.key: {key} is encrypted with a passphrase: the agent needs an unencrypted key (mode 600)")


def tls_context(ca: Path, cert: Path | None, key: Path | None) -> ssl.SSLContext:
    """A client context that trusts only ``ca``, checks the broker's host name, and presents ``cert``.

    ``cert`` and ``key`` come together or not at all; TLS 1.2 is the minimum. Use it with paho's
    ``Client.tls_set_context``. Problems with the files raise ConfigError naming the key.
    """
    if (cert is None) != (key is None):
        raise ConfigError("tls.cert and tls.key must be given together")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies the chain and host name
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_verify_locations(cafile=str(_readable(ca, "ca")))
    except ssl.SSLError as exc:
        raise ConfigError(f"tls.ca: {ca} holds no usable PEM CA certificate ({exc.reason or exc})") from None
    if cert is not None and key is not None:
        _readable(cert, "cert")
        _warn_if_exposed(_readable(key, "key"))
        try:
            # Never prompt on a terminal for a passphrase: a daemon has no one to answer it.
            context.load_cert_chain(str(cert), str(key), password=lambda: _encrypted(key))
        except ssl.SSLError as exc:
            raise ConfigError(
                f"tls.cert/tls.key: {cert} and {key} are not a matching PEM certificate and key "
                f"({exc.reason or exc})"
            ) from None
    return context
