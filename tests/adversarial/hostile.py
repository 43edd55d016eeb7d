"""Hostile peers for the fetch, API and origin attack cases: raw sockets that answer (or ask) as an attacker would.

:class:`HostileOrigin` accepts connections in this process, records each request head it reads and
answers with a behaviour (a redirect, a drip, ``100 Continue`` forever, an honest answer).
:func:`slow_clients` opens many connections from one loopback address that never finish a head.
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

__all__ = ["Behaviour", "HostileOrigin", "closed_within", "continue_forever", "drip", "recorder", "redirect",
           "slow_clients", "still_open"]

Behaviour = Callable[[socket.socket, bytes, threading.Event], None]


def _range(head: bytes) -> tuple[int, int] | None:
    match = re.search(rb"\r\nrange: bytes=(\d+)-(\d+)", head, re.IGNORECASE)
    return (int(match[1]), int(match[2])) if match else None


def redirect(location: str) -> Behaviour:
    def answer(sock: socket.socket, _head: bytes, _stop: threading.Event) -> None:
        sock.sendall(f"HTTP/1.1 302 Found\r\nLocation: {location}\r\nContent-Length: 0\r\n\r\n".encode())
    return answer


def recorder(sock: socket.socket, _head: bytes, _stop: threading.Event) -> None:
    """An internal service: answers 200 to anything (the test checks that nothing reached it)."""
    sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n")


def drip(data: bytes, every_s: float) -> Behaviour:
    """A well-formed 206 for the asked range whose body comes one correct byte every ``every_s`` seconds."""
    def answer(sock: socket.socket, head: bytes, stop: threading.Event) -> None:
        lo, hi = _range(head) or (0, len(data) - 1)
        sock.sendall(f"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {lo}-{hi}/{len(data)}\r\n"
                     f"Content-Length: {hi - lo + 1}\r\n\r\n".encode())
        for i in range(lo, hi + 1):
            if stop.wait(every_s):
                return
            sock.sendall(data[i:i + 1])
    return answer


def continue_forever(every_s: float) -> Behaviour:
    """``100 Continue`` again and again, never a final answer."""
    def answer(sock: socket.socket, _head: bytes, stop: threading.Event) -> None:
        while not stop.wait(every_s):
            sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
    return answer


@dataclass
class HostileOrigin:
    """A server on 127.0.0.1 answering every request with ``behaviour``; ``heads`` are the requests it read."""

    behaviour: Behaviour
    heads: list[bytes] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._stop = threading.Event()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            self._sockets.append(sock)
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while not self._stop.is_set():
                head = b""
                while b"\r\n\r\n" not in head:
                    data = sock.recv(65536)
                    if not data:
                        return
                    head += data
                self.heads.append(head)
                self.behaviour(sock, head, self._stop)

    def stop(self) -> None:
        self._stop.set()
        self._listener.close()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()


@contextlib.contextmanager
def slow_clients(port: int, count: int, source: str = "127.0.0.2", line: bytes = b"GET /api/v1/me HTTP/1.1\r\n",
                 tls: bool = False) -> Iterator[list[socket.socket]]:
    """``count`` connections from ``source`` that send ``line`` (the start of a head, never its end) and wait."""
    opened: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.settimeout(5)
            sock.bind((source, 0))
            try:
                sock.connect(("127.0.0.1", port))
                if line and not tls:
                    sock.sendall(line)
            except OSError:
                sock.close()
                continue
            opened.append(sock)
        yield opened
    finally:
        for sock in opened:
            sock.close()


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server ends ``sock`` (EOF or reset) within ``seconds``, reading whatever it answers."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        sock.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            if not sock.recv(65536):
                return True
        except TimeoutError:
            return False
        except OSError:
            return True
    return False


def still_open(socks: list[socket.socket], at_most: int, within_s: float = 10.0) -> list[socket.socket]:
    """The connections the server keeps, once they are ``at_most`` (it answers the others 503 or closes them)."""
    ended: set[int] = set()

    def kept() -> list[socket.socket] | None:
        for sock in socks:
            if id(sock) not in ended and closed_within(sock, 0.01):
                ended.add(id(sock))
        left = [sock for sock in socks if id(sock) not in ended]
        return left if len(left) <= at_most else None

    found: list[socket.socket] | None = None
    deadline = time.monotonic() + within_s
    while found is None and time.monotonic() < deadline:
        found = kept()
    assert found is not None, f"the server kept more than {at_most} of {len(socks)} connections"
    return found
