"""Who may call the inference API: loopback, a bearer token, or a client certificate (mutual TLS).

Off loopback the server refuses to start unless a token or mutual TLS guards it, or the operator
wrote ``inference.insecure: true``. Health probes (``/v2/health/*``, gRPC ``ServerLive`` and
``ServerReady``) stay open so that a supervisor can probe without the secret; they reveal only
liveness and whether a model is loaded. HTTP and gRPC take the same token (gRPC in the
``authorization`` metadata) and the same certificate files.
"""

from __future__ import annotations

import hmac
import logging
import ssl
from dataclasses import dataclass
from pathlib import Path

from edgecore.addresses import is_loopback
from edgecore.errors import ConfigError

__all__ = ["Access", "TlsFiles", "read_token", "server_tls_context"]

log = logging.getLogger(__name__)

OPEN_PATHS = ("/v2/health/live", "/v2/health/ready")


def read_token(path: Path) -> str:
    """The bearer token in ``path`` (first line); ConfigError naming the key when unusable."""
    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"inference.token_file: cannot read {path} ({exc.strerror})") from None
    if len(token) < 16:
        raise ConfigError(f"inference.token_file: {path} holds {len(token)} characters; use at least 16 random ones")
    if path.stat().st_mode & 0o077:
        log.warning("inference.token_file %s is readable by other users: chmod 600 it", path)
    return token


def server_tls_context(cert: Path, key: Path, client_ca: Path | None) -> ssl.SSLContext:
    """A server context presenting ``cert``; with ``client_ca``, clients must present a certificate it signed."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(str(cert), str(key))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"inference.tls_cert/tls_key: cannot load {cert} and {key} ({exc})") from None
    if client_ca is not None:
        try:
            context.load_verify_locations(cafile=str(client_ca))
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"inference.client_ca: cannot load {client_ca} ({exc})") from None
        context.verify_mode = ssl.CERT_REQUIRED
    return context


@dataclass(frozen=True)
class TlsFiles:
    """The server's certificate and key (PEM files) and, for mutual TLS, the CA its clients' certificates come from."""

    cert: Path
    key: Path
    client_ca: Path | None = None

    def ssl_context(self) -> ssl.SSLContext:
        """The HTTPS server context."""
        return server_tls_context(self.cert, self.key, self.client_ca)

    def read(self) -> tuple[bytes, bytes, bytes | None]:
        """Certificate, key and client CA as bytes (what gRPC takes); ConfigError naming the key."""
        def load(path: Path, key: str) -> bytes:
            try:
                return path.read_bytes()
            except OSError as exc:
                raise ConfigError(f"inference.{key}: cannot read {path} ({exc.strerror})") from None

        ca = load(self.client_ca, "client_ca") if self.client_ca is not None else None
        return load(self.cert, "tls_cert"), load(self.key, "tls_key"), ca


@dataclass(frozen=True)
class Access:
    """The guard every request passes: a bearer token where one is set."""

    token: str | None = None

    def allows(self, path: str, authorization: str | None) -> bool:
        """Whether a request for ``path`` with this Authorization header may proceed."""
        return path in OPEN_PATHS or self.permits(authorization)

    def permits(self, authorization: str | None) -> bool:
        """Whether an Authorization value (``Bearer <token>``) opens what the token guards."""
        if self.token is None:
            return True
        scheme, _, given = (authorization or "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self.token.encode())

    @staticmethod
    def check_exposure(host: str, token: str | None, tls: TlsFiles | None, insecure: bool) -> None:
        """Refuse to serve off loopback without a token or mutual TLS, unless ``insecure``."""
        mutual = tls is not None and tls.client_ca is not None
        if is_loopback(host) or token is not None or mutual:
            return
        if not insecure:
            raise ConfigError(
                f"inference.host {host} is not loopback and nothing authenticates clients: set inference.token_file, "
                "or inference.tls_cert, tls_key and client_ca (mutual TLS), or inference.insecure: true"
            )
        log.warning("inference API on %s without authentication (inference.insecure: true)", host)
