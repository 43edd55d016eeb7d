"""The one kept-alive HTTP(S) connection a fetch reads artifact ranges through.

Reopened when the URL's origin changes or the server closes it; :meth:`HttpConnection.abort`
breaks a blocked read from another thread (a cancel, or the fetch's watchdog). A redirect target
whose host the policy resolved and checked is connected to at that address, never looked up again.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import threading
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

__all__ = ["HttpConnection", "HttpSettings"]


@dataclass(frozen=True)
class HttpSettings:
    max_bytes_per_s: int | None = None  # None: no cap
    timeout_s: float = 15.0  # to connect, for one read, for a response head, and each chunk's grace
    ca_file: Path | None = None  # None: the system trust store
    min_bytes_per_s: int = 4096  # each chunk arrives at least this fast (beyond timeout_s), else the URL is stalled
    redirect_hosts: tuple[str, ...] = ()  # hosts (or *.domain) a redirect may lead to beyond the signed URLs' origins
    redirect_private: bool = False  # ... even when such a host resolves to an internal address

    @property
    def floor(self) -> int:
        """The slowest chunk rate taken: ``min_bytes_per_s``, or half the cap when the device caps itself lower."""
        cap = self.max_bytes_per_s
        return self.min_bytes_per_s if cap is None else max(1, min(self.min_bytes_per_s, cap // 2))


class HttpConnection:
    """One kept-alive connection to the host of the current URL; reopened when the server closes it."""

    def __init__(self, settings: HttpSettings) -> None:
        self.settings = settings
        self._conn: http.client.HTTPConnection | None = None
        self._origin: tuple[str, str, int, str | None] | None = None
        self._context: ssl.SSLContext | None = None
        self._lock = threading.Lock()

    def request(self, url: str, headers: dict[str, str], address: str | None = None) -> http.client.HTTPResponse:
        """GET ``url``; ``address``: connect there instead of looking the host up (a checked redirect target)."""
        parts = urllib.parse.urlsplit(url)
        scheme, host = parts.scheme, parts.hostname or ""
        origin = (scheme, host, parts.port or (443 if scheme == "https" else 80), address)
        with self._lock:
            if self._conn is None or self._origin != origin:
                self.close_locked()
                self._conn, self._origin = self._open(*origin), origin
            conn = self._conn
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        conn.request("GET", target, headers={"User-Agent": "edge-agent", **headers})
        return conn.getresponse()

    def _open(self, scheme: str, host: str, port: int, address: str | None) -> http.client.HTTPConnection:
        timeout = self.settings.timeout_s
        if scheme == "https":
            if self._context is None:
                ca = self.settings.ca_file
                self._context = ssl.create_default_context(cafile=str(ca) if ca else None)
            return _Https(host, port, timeout=timeout, context=self._context, address=address)
        return _Http(host, port, timeout=timeout, address=address)

    def abort(self) -> None:
        """From another thread: break a blocked read (cancel, a stall), so the fetch notices at once."""
        with self._lock:
            sock = self._conn.sock if self._conn is not None else None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        with self._lock:
            self.close_locked()

    def close_locked(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn, self._origin = None, None


class _Http(http.client.HTTPConnection):
    """A connection to ``address`` when given (the one a redirect's host was checked to resolve to)."""

    def __init__(self, host: str, port: int, timeout: float, address: str | None) -> None:
        super().__init__(host, port, timeout=timeout)
        self.address = address

    def connect(self) -> None:
        if self.address is None:
            return super().connect()
        self.sock = socket.create_connection((self.address, self.port), self.timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return None


class _Https(http.client.HTTPSConnection):
    """As :class:`_Http`, the certificate checked against the host name."""

    def __init__(self, host: str, port: int, timeout: float, context: ssl.SSLContext, address: str | None) -> None:
        super().__init__(host, port, timeout=timeout, context=context)
        self.address, self.tls = address, context

    def connect(self) -> None:
        if self.address is None:
            return super().connect()
        sock = socket.create_connection((self.address, self.port), self.timeout)
        self.sock = self.tls.wrap_socket(sock, server_hostname=self.host)
        return None
