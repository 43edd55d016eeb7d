"""Where an artifact URL's redirects may lead, so that a source cannot steer the device elsewhere.

The URLs a device fetches from are signed (they travel in the desired state), a redirect's target
is not: whoever answers the first URL chooses it. So a redirect is followed only when its target is
http or https, and its origin (scheme, host, port) is the origin of one of the signed URLs, or its
host is one the operator allows (``deploy.http_redirect_hosts``: ``cdn.example.org``, or
``*.amazonaws.com`` for any name under it). A host allowed that way must not resolve to a
loopback, private, link-local or otherwise internal address unless ``deploy.http_redirect_private``
says so, and the connection goes to the address that was checked (no second lookup to rebind).
At most :data:`MAX_REDIRECTS` hops are followed for one request.
"""

from __future__ import annotations

import ipaddress
import socket
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["MAX_REDIRECTS", "RedirectPolicy", "RedirectRefused", "origin_of"]

MAX_REDIRECTS = 3
Origin = tuple[str, str, int]


class RedirectRefused(ValueError):
    """A redirect the policy does not follow; the message says why."""


def origin_of(url: str) -> Origin:
    """(scheme, lower-case host, port) of an http(s) URL."""
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or (443 if scheme == "https" else 80)


def _internal(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return not ip.is_global or ip.is_multicast


@dataclass(frozen=True)
class RedirectPolicy:
    """The origins of the signed URLs, plus what the operator allows beyond them."""

    origins: frozenset[Origin]
    hosts: tuple[str, ...] = ()
    private: bool = False

    @classmethod
    def for_urls(cls, urls: Iterable[str], hosts: Iterable[str] = (), private: bool = False) -> RedirectPolicy:
        return cls(frozenset(origin_of(u) for u in urls), tuple(h.lower() for h in hosts), private)

    def check(self, url: str) -> str | None:
        """The address to connect to for a redirect to ``url`` (None: its host, as signed); RedirectRefused if it may
        not be followed."""
        parts = urllib.parse.urlsplit(url)
        if parts.scheme.lower() not in ("http", "https"):
            raise RedirectRefused(f"to a {parts.scheme or 'schemeless'}: URL (only http and https are followed)")
        origin = origin_of(url)
        if not origin[1]:
            raise RedirectRefused("to a URL without a host")
        if origin in self.origins:
            return None
        if not self._allowed_host(origin[1]):
            raise RedirectRefused(f"to {origin[0]}://{origin[1]}:{origin[2]}, neither the origin of a signed URL nor a "
                                  "host in deploy.http_redirect_hosts")
        return self._address(origin[1], origin[2])

    def _allowed_host(self, host: str) -> bool:
        return any(host == h or (h.startswith("*.") and host.endswith(h[1:])) for h in self.hosts)

    def _address(self, host: str, port: int) -> str:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise RedirectRefused(f"to {host}, which does not resolve ({exc.strerror or exc})") from None
        addresses = [str(info[4][0]) for info in infos]
        internal = [a for a in addresses if _internal(a)]
        if internal and not self.private:
            raise RedirectRefused(f"to {host}, which resolves to the internal address {internal[0]} "
                                  "(deploy.http_redirect_private is off)")
        return addresses[0]
