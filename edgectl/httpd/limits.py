"""What the host's HTTP servers let one client, one address and everyone together cost.

A connection is admitted before anything is read from it (TLS included): over the process's or
its address's limit it is answered 503 (plain HTTP) or closed (TLS) at once, so a flood of idle
or slow connections from one place cannot take the descriptors every other client, the store and
the broker connection need. The process limit never exceeds what ``RLIMIT_NOFILE`` leaves after a
reserve for everything else the process opens.
"""

from __future__ import annotations

import resource
from collections import Counter
from dataclasses import dataclass

__all__ = ["Occupancy", "ServerLimits", "descriptor_room"]

RESERVED_DESCRIPTORS = 128  # files, store and broker connections, pipes: what the process needs besides clients


@dataclass(frozen=True)
class ServerLimits:
    """Time limits and connection limits of one server (docs/security.md, "Servers")."""

    header_timeout_s: float = 10.0  # a new connection to the end of its first head; a request's first byte to its end
    idle_timeout_s: float = 30.0  # a kept-alive connection waiting for its next request
    body_timeout_s: float = 60.0  # a body's allowance beyond what min_body_bytes_per_s takes for its length
    min_body_bytes_per_s: int = 64 * 1024
    send_timeout_s: float = 60.0  # a client that stops reading an answer (per piece of at most 8 MiB)
    handshake_timeout_s: float = 10.0  # a TLS handshake, after the connection was admitted
    max_connections: int = 512  # open client connections in this process (capped by RLIMIT_NOFILE)
    max_per_address: int = 64  # open connections from one client address
    max_header_bytes: int = 32 * 1024  # request line and headers

    def body_deadline_s(self, length: int) -> float:
        """Seconds a body of ``length`` bytes may take to arrive."""
        return self.body_timeout_s + length / self.min_body_bytes_per_s


def descriptor_room(reserve: int = RESERVED_DESCRIPTORS) -> int:
    """Client connections this process can hold: the descriptor limit (raised to the hard limit) minus ``reserve``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY:
        return 1 << 20
    return max(1, soft - reserve)


class Occupancy:
    """Open connections in total and per address; used on the server's event loop only (no lock)."""

    def __init__(self, limits: ServerLimits, room: int) -> None:
        self.max_total = min(limits.max_connections, room)
        self.max_per_address = limits.max_per_address
        self.total = 0
        self.by_address: Counter[str] = Counter()

    def enter(self, address: str) -> str | None:
        """Count a new connection from ``address``; the reason it is refused (not counted), or None."""
        if self.total >= self.max_total:
            return f"the server holds {self.total} connections, its limit"
        if self.by_address[address] >= self.max_per_address:
            return f"{address} holds {self.by_address[address]} connections, the limit per address"
        self.total += 1
        self.by_address[address] += 1
        return None

    def leave(self, address: str) -> None:
        self.total -= 1
        self.by_address[address] -= 1
        if self.by_address[address] <= 0:
            del self.by_address[address]
