"""The host's HTTP connection handling in process: request heads parsed at their edges, and one connection's
requests served by ``serve_connection`` over a real loopback socket (asyncio streams, no thread, no child
process), with limits small enough to watch each act: bodies read, saved, cut short or left unread, idle and
head timeouts, heads over the limit, clients that leave, errors and keep-alive. Occupancy counted per address.
./scripts/mutants runs these for edgectl/httpd/request.py, connection.py and limits.py."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from edgectl.httpd.connection import Body, Reply, serve_connection
from edgectl.httpd.limits import Occupancy, ServerLimits
from edgectl.httpd.request import HttpError, RequestHead, parse_head

LIMITS = ServerLimits(header_timeout_s=0.3, idle_timeout_s=1.5, body_timeout_s=0.3, min_body_bytes_per_s=1 << 20,
                      max_header_bytes=1024)
GET = b"GET /a HTTP/1.1\r\nHost: h\r\n\r\n"


# -- request heads ------------------------------------------------------------------------------------------------


def test_a_head_has_no_body_and_keeps_alive_unless_it_says_otherwise() -> None:
    head = parse_head(GET, "peer")
    assert (head.method, head.target, head.version, head.keep_alive, head.chunked, head.content_length) == \
        ("GET", "/a", "1.1", True, False, 0)
    closing = parse_head(b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n", "peer")
    assert closing.keep_alive is False
    assert parse_head(b"GET / HTTP/1.0\r\n\r\n", "peer").keep_alive is False
    assert parse_head(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\n", "peer").content_length == 5
    assert parse_head(b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n", "peer").chunked is True


def test_defaults_of_a_request_head_and_an_error() -> None:
    head = RequestHead("GET", "/", {}, "peer")
    assert (head.version, head.keep_alive, head.chunked, head.content_length) == ("1.1", True, False, 0)
    assert HttpError(400, "m").close is True and HttpError(400, "m").headers == {}
    assert HttpError(404, "m", close=False).close is False


@pytest.mark.parametrize("raw", [b"GET / HTTP/1.1\r\nHost: h\r\n", b"GET / HTTP/1.1\r\n", b"GET / HTTP/1.1"])
def test_a_head_without_its_blank_line_is_refused(raw: bytes) -> None:
    with pytest.raises(HttpError) as caught:
        parse_head(raw, "peer")
    assert caught.value.status == 400
    assert caught.value.message == "malformed request: the head does not end where its blank line is"


@pytest.mark.parametrize("target", [b"http://[::1", b"http://:80/", b"http://a:99999/"])
def test_an_absolute_target_that_is_not_a_url_is_refused(target: bytes) -> None:
    with pytest.raises(HttpError) as caught:
        parse_head(b"GET " + target + b" HTTP/1.1\r\nHost: h\r\n\r\n", "peer")
    assert (caught.value.status, caught.value.message) == (400, f"malformed request target '{target.decode()}'")


# -- occupancy ----------------------------------------------------------------------------------------------------


def test_leaving_gives_back_exactly_one_place() -> None:
    occupancy = Occupancy(ServerLimits(max_connections=10, max_per_address=2), 100)
    assert occupancy.enter("a") is None and occupancy.enter("a") is None and occupancy.enter("b") is None
    assert occupancy.enter("a") == "a holds 2 connections, the limit per address"
    occupancy.leave("a")
    assert (occupancy.total, dict(occupancy.by_address)) == (2, {"a": 1, "b": 1})
    assert occupancy.enter("a") is None
    occupancy.leave("a")
    occupancy.leave("a")
    assert (occupancy.total, dict(occupancy.by_address)) == (1, {"b": 1})
    occupancy.leave("b")
    assert (occupancy.total, dict(occupancy.by_address)) == (0, {})


# -- one connection, served in process ------------------------------------------------------------------------------


@dataclass
class Served:
    answer: bytes  # everything the client read until the server closed
    ended: BaseException | None  # what serve_connection raised; None: it returned
    saved: list[bytes] = field(default_factory=list)


Step = bytes | float  # bytes to send, or seconds to wait


async def _serve(steps: list[Step], handler: Callable[[RequestHead, Body], Awaitable[Reply]],
                 limits: ServerLimits = LIMITS, half_close: bool = True) -> Served:
    done: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()

    def page(error: HttpError) -> Reply:
        return Reply(error.status, error.message.encode(), "text/plain", error.headers)

    async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await serve_connection(reader, writer, handler, page, limits, "peer")
            done.set_result(None)
        except BaseException as exc:  # the test looks at what ended the connection
            done.set_result(exc)
        finally:
            writer.close()

    server = await asyncio.start_server(connected, "127.0.0.1", 0, limit=limits.max_header_bytes)
    try:
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for step in steps:
            if isinstance(step, bytes):
                writer.write(step)
                await writer.drain()
            else:
                await asyncio.sleep(step)
        if half_close:
            writer.write_eof()
        async with asyncio.timeout(10):
            answer = await reader.read(-1)
            ended = await done
        writer.close()
        return Served(answer, ended)
    finally:
        server.close()


def serve(steps: list[Step], handler: Callable[[RequestHead, Body], Awaitable[Reply]], limits: ServerLimits = LIMITS,
          half_close: bool = True) -> Served:
    return asyncio.run(_serve(steps, handler, limits, half_close))


async def ignore_body(head: RequestHead, _body: Body) -> Reply:
    return Reply(200, f"{head.method} {head.target}".encode(), "text/plain")


async def read_body(head: RequestHead, body: Body) -> Reply:
    data = await body.read(100)
    return Reply(200, b"read " + data, "text/plain")


def _statuses(answer: bytes) -> list[int]:
    return [int(status) for status in re.findall(rb"HTTP/1\.1 (\d{3}) ", answer)]


def test_requests_without_a_body_keep_the_connection_and_the_client_leaving_ends_it_quietly() -> None:
    served = serve([GET, GET.replace(b"/a", b"/b")], ignore_body)
    assert _statuses(served.answer) == [200, 200] and served.answer.endswith(b"GET /b")
    assert b"Connection: close" not in served.answer
    assert served.ended is None


def test_a_client_that_connects_and_leaves_gets_nothing() -> None:
    served = serve([], ignore_body)
    assert served.answer == b"" and served.ended is None


def test_an_empty_body_is_read_as_empty_and_keeps_the_connection() -> None:
    post = b"POST /p HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n"
    served = serve([post, post], read_body)
    assert _statuses(served.answer) == [200, 200] and served.answer.endswith(b"read ")


def test_a_body_left_unread_closes_the_connection_after_the_answer() -> None:
    post = b"POST /p HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\n\r\nx"
    served = serve([post, GET], ignore_body)
    assert _statuses(served.answer) == [200] and b"Connection: close" in served.answer


def test_a_body_read_keeps_the_connection() -> None:
    post = b"POST /p HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc"
    served = serve([post, post], read_body)
    assert _statuses(served.answer) == [200, 200] and served.answer.count(b"read abc") == 2


def test_a_client_that_leaves_in_the_middle_of_its_body_gets_no_answer() -> None:
    served = serve([b"POST /p HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\nabc"], read_body)
    assert served.answer == b""
    assert isinstance(served.ended, ConnectionResetError) and "in the middle of its body" in str(served.ended)


def _saver(into: list[bytes], tmp: Path) -> Callable[[RequestHead, Body], Awaitable[Reply]]:
    async def save(_head: RequestHead, body: Body) -> Reply:
        path = tmp / f"body{len(into)}"
        length = await body.save(path, 1 << 22)
        into.append(path.read_bytes())
        return Reply(200, f"saved {length}".encode(), "text/plain")
    return save


def test_a_saved_body_is_written_whole_and_keeps_the_connection(tmp_path: Path) -> None:
    saved: list[bytes] = []
    data = bytes(range(256)) * 5000  # 1.28 MB: several reads
    post = b"POST /u HTTP/1.1\r\nHost: h\r\nContent-Length: %d\r\n\r\n" % len(data)
    served = serve([post + data, post.replace(b"%d" % len(data), b"0")], _saver(saved, tmp_path))
    assert _statuses(served.answer) == [200, 200] and saved == [data, b""]
    assert b"saved 1280000" in served.answer and served.answer.endswith(b"saved 0")


def test_a_saved_body_that_ends_early_is_a_bad_request(tmp_path: Path) -> None:
    saved: list[bytes] = []
    served = serve([b"POST /u HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\nabc"], _saver(saved, tmp_path))
    assert _statuses(served.answer) == [400] and served.answer.endswith(b"body: ended after 3 of 10 bytes")
    assert saved == []


def test_a_saved_body_that_stalls_is_cut_with_408(tmp_path: Path) -> None:
    saved: list[bytes] = []
    served = serve([b"POST /u HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\nabc", 1.0], _saver(saved, tmp_path))
    assert _statuses(served.answer) == [408] and served.answer.endswith(b"the body did not arrive within 0 s")
    assert b"Connection: close" in served.answer and saved == []


def test_a_handler_error_closes_the_connection_unless_it_says_not_to() -> None:
    async def refuse(head: RequestHead, _body: Body) -> Reply:
        raise HttpError(404, "no such thing", close=head.target == "/close")

    kept = serve([GET.replace(b"/a", b"/keep"), GET.replace(b"/a", b"/keep")], refuse)
    assert _statuses(kept.answer) == [404, 404] and b"Connection: close" not in kept.answer
    closed = serve([GET.replace(b"/a", b"/close"), GET], refuse)
    assert _statuses(closed.answer) == [404] and b"Connection: close" in closed.answer


def test_a_handler_that_fails_is_answered_500_and_the_connection_goes_on() -> None:
    async def broken(head: RequestHead, _body: Body) -> Reply:
        if head.target == "/a":
            raise RuntimeError("bug")
        return Reply(200, b"ok", "text/plain")

    served = serve([GET, GET.replace(b"/a", b"/b")], broken)
    assert _statuses(served.answer) == [500, 200]
    assert b"internal error (see the server log)" in served.answer and served.ended is None


def test_a_kept_alive_connection_waits_its_idle_time_not_the_head_time_for_the_next_request() -> None:
    served = serve([GET, 0.6, GET.replace(b"/a", b"/b")], ignore_body)  # 0.6 s: past the head limit, inside the idle one
    assert _statuses(served.answer) == [200, 200] and served.answer.endswith(b"GET /b")


def test_an_idle_kept_alive_connection_is_closed_without_an_answer() -> None:
    served = serve([GET, 2.0], ignore_body, half_close=False)
    assert _statuses(served.answer) == [200] and served.ended is None


def test_an_http_10_client_is_told_that_the_connection_stays() -> None:
    served = serve([b"GET /a HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"], ignore_body)
    assert _statuses(served.answer) == [200] and b"Connection: keep-alive" in served.answer
    plain = serve([GET], ignore_body)
    assert b"Connection: keep-alive" not in plain.answer


def test_a_head_over_the_limit_is_refused_with_431() -> None:
    served = serve([b"GET /a HTTP/1.1\r\nHost: h\r\nX: " + b"x" * 2000 + b"\r\n\r\n"], ignore_body)
    assert _statuses(served.answer) == [431] and served.answer.endswith(b"the request head is over 1024 bytes")


def test_a_client_that_leaves_in_the_middle_of_a_head_ends_the_connection_with_a_reset() -> None:
    for steps in ([b"GET /a HTTP/1.1\r\n"], [GET, b"GET /b HT"]):
        served = serve(steps, ignore_body)  # type: ignore[arg-type]
        assert isinstance(served.ended, ConnectionResetError), steps
        assert "in the middle of a request head" in str(served.ended)


def test_a_later_request_of_one_character_is_read_to_its_blank_line_and_refused_at_once() -> None:
    served = serve([GET, b"X\r\n\r\n"], ignore_body)  # the idle wait takes one byte; the head is the rest
    assert _statuses(served.answer) == [200, 501]  # no such method, at once: not a 408 after the head time
