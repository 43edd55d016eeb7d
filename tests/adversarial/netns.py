"""A host of its own for one process: a Linux network namespace joined to this one by a veth pair, whose link a test cuts.

The namespace's end of the pair is ``10.200.A.B+2/30`` and this host's end ``10.200.A.B+1/30`` (a /30 picked at
random among those no interface here uses, so parallel workers do not clash). A process started under
:attr:`Netns.prefix` (``ip netns exec NAME``, which execs: the same pid) reaches this host over the network only at
:attr:`Netns.host_ip`, never at 127.0.0.1 (the namespace's loopback is its own); unix sockets, on the filesystem both
share, it still reaches, so give it TCP addresses. :meth:`Netns.cut` takes this host's end of the pair down: every
packet either way is dropped and neither end hears anything from the other (no FIN, no RST), as when a host loses
power or its cable: each finds out by its own timeouts. :meth:`Netns.restore` brings the link back, and the
connections that neither end gave up on carry on.

Making one needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN), ``ip`` (iproute2) and ``unshare``: :func:`unavailable` says
why it cannot be made here, for a skip, and :func:`netns` raises :class:`NetnsUnavailable` where ``ip`` cannot make
the namespace or the pair all the same.
"""

from __future__ import annotations

import ipaddress
import os
import random
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

__all__ = ["Netns", "NetnsUnavailable", "netns", "unavailable"]


class NetnsUnavailable(RuntimeError):
    """The namespace or its veth pair could not be made here (no /run/netns, no veth driver...)."""


def _ip() -> str | None:
    return shutil.which("ip") or next((p for p in ("/usr/sbin/ip", "/sbin/ip") if os.path.exists(p)), None)


def unavailable() -> str | None:
    """Why no network namespace can be made here (for ``pytest.skip``), or None."""
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN and CAP_SYS_ADMIN): run the tests as root"
    if _ip() is None:
        return "network namespaces need `ip` (iproute2): apt-get install iproute2"
    if shutil.which("unshare") is None:
        return "network namespaces need `unshare` (util-linux)"
    try:
        made = subprocess.run(["unshare", "-n", "true"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`unshare -n true` failed: {exc}"
    if made.returncode != 0:
        return f"`unshare -n true` failed (no network namespaces here): {made.stderr.strip() or made.returncode}"
    return None


@dataclass
class Netns:
    """One namespace and its veth pair; see the module docstring."""

    name: str
    host_if: str  # this host's end of the pair
    ns_if: str  # the namespace's end
    host_ip: str
    ns_ip: str
    ip: str  # the `ip` binary

    @property
    def prefix(self) -> list[str]:
        """The command that runs what follows it in the namespace (same pid: ``ip netns exec`` execs it)."""
        return [self.ip, "netns", "exec", self.name]

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``ip ARGS`` on this host."""
        result = subprocess.run([self.ip, *args], capture_output=True, text=True, timeout=30)
        if check and result.returncode != 0:
            raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip() or result.returncode}")
        return result

    def cut(self) -> None:
        """The namespace's host vanishes: packets either way are dropped, silently."""
        self.run("link", "set", self.host_if, "down")

    def restore(self) -> None:
        """The link is back (the addresses stayed, the host's route to the namespace comes back with it)."""
        self.run("link", "set", self.host_if, "up")


def _free_subnet() -> ipaddress.IPv4Network:
    """A /30 of 10.200.0.0/16 that no address here falls in (another worker's pair, say)."""
    taken = subprocess.run([_ip() or "ip", "-4", "-o", "addr"], capture_output=True, text=True, timeout=30).stdout
    used = [ipaddress.ip_interface(word) for line in taken.splitlines() for word in line.split() if "/" in word
            and word[0].isdigit()]
    for _ in range(100):
        subnet = ipaddress.IPv4Network(f"10.200.{random.randrange(256)}.{4 * random.randrange(64)}/30")
        if not any(subnet.overlaps(i.network) for i in used):
            return subnet
    raise RuntimeError("no free /30 in 10.200.0.0/16")


@contextmanager
def netns() -> Iterator[Netns]:
    """A fresh namespace and veth pair, link up, loopback up in it; both removed at exit, whatever happened."""
    ip = _ip()
    assert ip is not None, unavailable()
    token = uuid.uuid4().hex[:6]
    subnet = _free_subnet()
    host_ip, ns_ip = (str(a) for a in subnet.hosts())
    space = Netns(f"edgectl-{token}", f"evh{token}", f"evn{token}", host_ip, ns_ip, ip)
    try:
        space.run("netns", "add", space.name)
    except RuntimeError as exc:
        raise NetnsUnavailable(str(exc)) from None
    try:
        try:
            space.run("link", "add", space.host_if, "type", "veth", "peer", "name", space.ns_if)
        except RuntimeError as exc:
            raise NetnsUnavailable(str(exc)) from None
        space.run("link", "set", space.ns_if, "netns", space.name)
        space.run("addr", "add", f"{host_ip}/30", "dev", space.host_if)
        space.run("link", "set", space.host_if, "up")
        space.run("-n", space.name, "addr", "add", f"{ns_ip}/30", "dev", space.ns_if)
        space.run("-n", space.name, "link", "set", space.ns_if, "up")
        space.run("-n", space.name, "link", "set", "lo", "up")
        yield space
    finally:
        space.run("link", "del", space.host_if, check=False)  # the pair goes with either end
        space.run("netns", "del", space.name, check=False)
