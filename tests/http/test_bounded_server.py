"""The host's bounded HTTP server (edgectl.httpd) in process, with limits small enough to watch each one act.

Heads llhttp refuses, the checks added beside it, connection limits per address and in all, the
header, idle and body timeouts, bodies refused before they are read, HEAD, ``Expect: 100-continue``
and a TLS client that never shakes hands. The REST API and the artifact origin run on this server;
their own attack cases against real processes are in tests/adversarial.
"""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from edgectl.httpd import Body, HttpError, HttpServer, Reply, RequestHead, ServerLimits
from edgectl.httpd.limits import Occupancy
from edgectl.httpd.request import parse_head
from edgectl.pki.authority import FleetPki
from edgectl.pki.certs import Algorithm, Usage
from tests.adversarial.hostile import closed_within

LIMITS = ServerLimits(header_timeout_s=1.0, idle_timeout_s=1.0, body_timeout_s=1.0, min_body_bytes_per_s=1 << 20,
                      handshake_timeout_s=1.0, max_connections=6, max_per_address=3, max_header_bytes=2048)


async def echo(head: RequestHead, body: Body) -> Reply:
    data = await body.read(100) if head.method == "POST" else b""
    return Reply(200, f"{head.method} {head.target} {len(data)}".encode(), "text/plain")


def page(error: HttpError) -> Reply:
    return Reply(error.status, error.message.encode(), "text/plain", error.headers)


@pytest.fixture
def server() -> Iterator[Callable[..., HttpServer]]:
    started: list[HttpServer] = []

    def start(tls: ssl.SSLContext | None = None, limits: ServerLimits = LIMITS) -> HttpServer:
        served = HttpServer("127.0.0.1", 0, echo, page, tls, limits, "test").start()
        started.append(served)
        return served

    yield start
    for served in started:
        served.stop()


def _exchange(port: int, raw: bytes, source: str = "127.0.0.1") -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0)) as sock:
        sock.sendall(raw)
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
    return got


GET = b"GET /x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"


@pytest.mark.parametrize(("raw", "status", "why"), [
    (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n", 400, "Duplicate Content-Length"),
    (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nContent-Length: 9\r\n\r\n", 400, "Duplicate Content-Length"),
    (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2, 2\r\n\r\n", 400, "Invalid character in Content-Length"),
    (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999\r\n\r\n", 400, "Content-Length overflow"),
    (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n", 400, "Transfer-Encoding"),
    (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n", 400, "invalid `Transfer-Encoding`"),
    (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501, "'gzip, chunked' is not supported"),
    (b"GET / HTTP/1.1\r\n\r\n", 400, "exactly one Host header; it has 0"),
    (b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400, "exactly one Host header; it has 2"),
    (b"GET / HTTP/2.0\r\nHost: a\r\n\r\n", 505, "HTTP/2.0 is not supported"),
    (b"BREW / HTTP/1.1\r\nHost: a\r\n\r\n", 501, "not one this server knows"),
    (b"GET gopher://a/x HTTP/1.1\r\nHost: a\r\n\r\n", 400, "neither a path nor an http URL"),
])
def test_heads_that_break_the_protocol_are_refused(raw: bytes, status: int, why: str) -> None:
    with pytest.raises(HttpError) as caught:
        parse_head(raw, "peer")
    assert caught.value.status == status and why in caught.value.message


def test_a_head_is_read_as_sent() -> None:
    head = parse_head(b"GET http://a:1/p?q=1 HTTP/1.0\r\nContent-Length: 5\r\nX-A: 1\r\nx-a: 2\r\n\r\n", "peer")
    assert (head.method, head.target, head.version, head.content_length) == ("GET", "/p?q=1", "1.0", 5)
    assert head.headers["x-a"] == "1, 2" and not head.keep_alive
    assert parse_head(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", "peer").keep_alive


def test_occupancy_counts_each_address_and_all_together() -> None:
    occupancy = Occupancy(LIMITS, room=5)
    assert occupancy.max_total == 5  # the descriptors left cap the configured 6
    assert [occupancy.enter("a") for _ in range(3)] == [None, None, None]
    assert "the limit per address" in (occupancy.enter("a") or "")
    assert [occupancy.enter("b") for _ in range(2)] == [None, None]
    assert "its limit" in (occupancy.enter("c") or "")
    occupancy.leave("a")
    assert occupancy.enter("c") is None and occupancy.by_address == {"a": 2, "b": 2, "c": 1}


def test_past_the_limit_per_address_a_client_gets_503_and_others_are_served(server: Callable[..., HttpServer]) -> None:
    served = server()
    held = [socket.create_connection(("127.0.0.1", served.port), source_address=("127.0.0.2", 0)) for _ in range(3)]
    try:
        refused = _exchange(served.port, GET, "127.0.0.2")
        assert refused.startswith(b"HTTP/1.1 503 ") and b"Retry-After: 1" in refused
        assert _exchange(served.port, GET).startswith(b"HTTP/1.1 200 ")  # another address
        assert served.refused == 1
    finally:
        for sock in held:
            sock.close()


def test_a_head_that_does_not_end_is_cut_with_408(server: Callable[..., HttpServer]) -> None:
    port = server().port
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        started = time.monotonic()
        sock.sendall(b"GET / HTTP/1.1\r\nHost: a\r\n")
        answer = sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 408 ") and closed_within(sock, 5)
        assert time.monotonic() - started < 4
    with socket.create_connection(("127.0.0.1", port), timeout=5) as silent:  # connected, never a byte
        assert silent.recv(65536).startswith(b"HTTP/1.1 408 ")


def test_an_idle_kept_alive_connection_is_closed(server: Callable[..., HttpServer]) -> None:
    with socket.create_connection(("127.0.0.1", server().port), timeout=5) as sock:
        sock.sendall(b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
        assert closed_within(sock, 4)


def test_bodies_are_refused_by_their_size_before_they_are_read(server: Callable[..., HttpServer]) -> None:
    port = server().port
    too_big = _exchange(port, b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 101\r\n\r\n")
    assert too_big.startswith(b"HTTP/1.1 413 ") and b"Connection: close" in too_big
    assert _exchange(port, b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n").startswith(b"HTTP/1.1 411 ")
    assert _exchange(port, b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\n" + b"x" * 100).startswith(
        b"HTTP/1.1 200 ")


def test_a_body_that_does_not_arrive_is_cut_with_408(server: Callable[..., HttpServer]) -> None:
    with socket.create_connection(("127.0.0.1", server().port), timeout=5) as sock:
        sock.sendall(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 50\r\n\r\nxx")
        assert sock.recv(65536).startswith(b"HTTP/1.1 408 ") and closed_within(sock, 3)


def test_head_expect_and_keep_alive(server: Callable[..., HttpServer]) -> None:
    port = server().port
    head = _exchange(port, b"HEAD /x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and b"Content-Length: 9" in head and head.endswith(b"\r\n\r\n")
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n")
        assert sock.recv(65536) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(b"abc")
        assert sock.recv(65536).endswith(b"POST / 3")
        sock.sendall(GET)  # the same connection serves the next request
        assert sock.recv(65536).endswith(b"GET /x 0")
    assert _exchange(port, b"GET / HTTP/1.1\r\nHost: a\r\nExpect: magic\r\n\r\n").startswith(b"HTTP/1.1 417 ")


def test_a_body_left_unread_closes_the_connection(server: Callable[..., HttpServer]) -> None:
    answer = _exchange(server().port, b"GET /x HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nGET /y")
    assert answer.count(b"HTTP/1.1 ") == 1 and b"Connection: close" in answer


def test_a_tls_client_that_never_shakes_hands_delays_no_other(server: Callable[..., HttpServer], tmp_path: Path) -> None:
    pki = FleetPki.init(tmp_path / "pki", Algorithm.P256)
    identity = pki.issue("test", Usage.SERVER, 1, hosts=["127.0.0.1"])
    (tmp_path / "c.pem").write_bytes(identity.cert_pem)
    (tmp_path / "k.pem").write_bytes(identity.key_pem)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "c.pem", tmp_path / "k.pem")
    served = server(context)
    client = ssl.create_default_context(cafile=str(pki.ca_cert_path))
    with socket.create_connection(("127.0.0.1", served.port), timeout=5) as silent:
        with client.wrap_socket(socket.create_connection(("127.0.0.1", served.port), timeout=5),
                                server_hostname="127.0.0.1") as tls:
            tls.sendall(GET)
            assert tls.recv(65536).startswith(b"HTTP/1.1 200 ")
        assert closed_within(silent, 4), "a handshake that never started outlived its timeout"
