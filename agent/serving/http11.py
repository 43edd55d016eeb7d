"""HTTP/1.1 connections on asyncio: parsed by llhttp, bounded, time-limited, never a thread per connection.

Connections live on one event loop: a client that never finishes its headers (slowloris) costs a
coroutine and a socket, not a thread, and is cut after ``header_timeout_s``. The head (request line
to the blank line, at most ``max_header_bytes``) is parsed by llhttp (``http_head``); the request
is then admitted (who may call, is there room in the queue and the byte budget) before its body is
read, so a refusal costs no memory. ``Expect: 100-continue`` gets its ``100 Continue`` when the
request is admitted, or the final refusal at once. Bodies are read on the loop under
``body_timeout_s``: a ``Content-Length`` body in one read, a chunked one chunk by chunk, each
chunk reserved in the budget as it comes and the whole capped at ``max_request_bytes``. What
cannot be served now (budget, connection cap) gets a 503 with ``Retry-After``; what can never be
served gets a 413/431. A response that closes the connection half-closes it and drains what the
client still sends (a "lingering close"), so clients see the answer instead of a TCP reset.

Per request the loop does as little as it can (it is the one thread every request passes through):
time limits are ``asyncio.timeout`` scopes rather than ``wait_for`` tasks; a body, whose bytes the
budget already holds, is read without the header limit's flow control, which would otherwise
pause and resume the socket every 128 KiB (``http_body.read_body``); and the answers to pipelined
``GET``/``HEAD`` requests whose heads are already buffered leave together in one write (a send
system call per answer costs more than the answer), while anything else first flushes what is held.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from email.utils import formatdate
from http import HTTPStatus

from agent.serving.budget import ByteBudget
from agent.serving.http_body import BodyRefused, ClientGone, discard, read_body, read_chunked, within
from agent.serving.http_head import BadRequest, Incoming, Request, parse_head

__all__ = ["HttpLimits", "Request", "Response", "error", "json_response", "serve_connection"]

log = logging.getLogger(__name__)

_LINGER_S = 2.0
_LINGER_BYTES = 64 * 2**20
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_HELD_MAX = 32  # answers held for one write at most
_LARGE = 2**16  # a body this large is written on its own, not copied into a joined buffer


@dataclass(frozen=True)
class HttpLimits:
    """What one connection and all of them together may cost."""

    max_request_bytes: int = 64 * 2**20
    max_header_bytes: int = 64 * 1024
    header_timeout_s: float = 10.0  # from the first byte of a request to the end of its headers
    body_timeout_s: float = 60.0  # to receive the whole body
    idle_timeout_s: float = 60.0  # a keep-alive connection waiting for its next request
    max_connections: int = 2048


@dataclass
class Response:
    """What a handler returns."""

    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    close: bool = False
    head_only: bool = False  # answer to HEAD: the GET's headers, no body


def json_response(status: int, payload: object, headers: dict[str, str] | None = None, close: bool = False) -> Response:
    """A JSON response (``allow_nan=False``: JSON has no NaN)."""
    body = json.dumps(payload, allow_nan=False, separators=(",", ":")).encode()
    return Response(int(status), body, "application/json", dict(headers or {}), close)


def error(status: int, message: str, headers: dict[str, str] | None = None, close: bool = False) -> Response:
    """The protocol's error object ``{"error": message}``."""
    return json_response(status, {"error": message}, headers, close)


Handler = Callable[[Request], Awaitable[Response]]
# Called once the head is parsed with the body's length (for a chunked body: 0 at its head, then
# again with its size once it has arrived); reserves the request's memory or returns the refusal.
Admit = Callable[[Request, int], Response | None]


async def serve_connection(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    limits: HttpLimits,
    budget: ByteBudget,
    admit: Admit,
    handler: Handler,
    over_capacity: bool,
) -> None:
    """Serve one connection's requests in turn until it closes, times out or misbehaves."""
    peer = _peer(writer)
    incoming: Incoming | None = None
    out = _Output(writer)
    sock = writer.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        if over_capacity:
            await out.send(error(503, "too many connections; retry later", {"Retry-After": "1"}, close=True))
            await _linger(reader, writer)
            return
        while True:
            if out.held and not _head_buffered(reader):
                await out.flush()  # nothing more is ready to answer: send what is held before waiting
            head = await _read_head(reader, out, limits)
            if head is None:
                return
            request, incoming = parse_head(head, peer, incoming)
            if request.method not in ("GET", "HEAD"):
                await out.flush()  # a body to read or work that may take long: earlier answers leave first
            response = await _serve_one(reader, writer, request, incoming, limits, budget, admit, handler)
            if not request.keep_alive:
                response.close = True
            await out.send(response, keep_alive_10=request.version == "1.0", hold=not response.close)
            if response.close:
                await _linger(reader, writer)
                return
    except BadRequest as exc:
        await out.send(error(exc.status, str(exc), close=True))
        await _linger(reader, writer)
    except (ClientGone, ConnectionError, asyncio.IncompleteReadError):
        pass
    except Exception:
        log.exception("connection from %s failed", peer)
    finally:
        with contextlib.suppress(Exception):
            await out.flush()  # answers already given, when the client is still there to read them
        if incoming is not None:
            incoming.release()
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def _serve_one(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    request: Request,
    incoming: Incoming,
    limits: HttpLimits,
    budget: ByteBudget,
    admit: Admit,
    handler: Handler,
) -> Response:
    expect = request.headers.get("expect")
    if expect is not None and expect.lower() != "100-continue":
        return error(417, f"Expect '{expect[:60]}' is not supported; only 100-continue is", close=True)
    length = request.content_length
    if length > limits.max_request_bytes:
        return error(413, f"request is {length} bytes; the limit is {limits.max_request_bytes}", close=True)
    refusal = admit(request, length)
    if refusal is not None:
        if expect is not None or request.chunked:
            refusal.close = True  # the body is not read: the client may not send it, or it has no known end
        else:  # read and drop the body so the connection stays usable; a refusal costs no memory
            await discard(reader, length, limits.body_timeout_s)
        return refusal
    try:
        if expect is not None and (length or request.chunked):
            writer.write(_CONTINUE)
        if request.chunked:
            refusal = await _receive_chunked(reader, request, incoming, limits, budget, admit)
            if refusal is not None:
                return refusal
        elif length:
            request.body = await read_body(reader, length, limits.body_timeout_s)
        return await handler(request)
    finally:
        budget.release(request.reserved)


async def _read_head(reader: asyncio.StreamReader, out: _Output, limits: HttpLimits) -> bytes | None:
    """The next request's line and headers; None when the client closed or idled out."""
    try:
        first = await within(limits.idle_timeout_s, reader.read(1))
    except TimeoutError:
        return None
    if not first:
        return None
    try:
        rest = await within(limits.header_timeout_s, reader.readuntil(b"\r\n\r\n"))
    except TimeoutError:
        await out.send(error(408, f"headers not received within {limits.header_timeout_s:g} s", close=True))
        raise ClientGone from None
    except asyncio.LimitOverrunError:
        await out.send(error(431, f"request headers exceed {limits.max_header_bytes} bytes", close=True))
        raise ClientGone from None
    return first + rest


def _head_buffered(reader: asyncio.StreamReader) -> bool:
    """Whether the reader already holds the next request's whole head (a pipelining client)."""
    buffer = getattr(reader, "_buffer", b"")
    return b"\r\n\r\n" in buffer


async def _receive_chunked(
    reader: asyncio.StreamReader, request: Request, incoming: Incoming, limits: HttpLimits, budget: ByteBudget,
    admit: Admit,
) -> Response | None:
    """Read a chunked body into ``request.body``, then admit its size; the refusal, or None.

    While they arrive, the chunks are held in the budget under ``request.reserved`` (released by
    the caller whatever happens); once the size is known that is swapped for what ``admit``
    reserves for the whole request, JSON weight included.
    """
    try:
        body = await read_chunked(reader, request, incoming, limits.max_request_bytes, budget, limits.body_timeout_s)
    except BodyRefused as refused:
        return error(refused.status, str(refused), {"Retry-After": "1"} if refused.status == 503 else None, close=True)
    budget.release(request.reserved)
    request.reserved = 0
    refusal = admit(request, len(body))
    if refusal is None:
        request.body = body
    return refusal


_date_cache: list[tuple[int, str]] = [(0, "")]


def _date() -> str:
    """The IMF-fixdate of this second (RFC 9110 6.6.1), formatted once a second."""
    now = int(time.time())
    second, text = _date_cache[0]
    if second != now:
        text = formatdate(now, usegmt=True)
        _date_cache[0] = (now, text)
    return text


class _Output:
    """A connection's answers on their way out: held while more pipelined answers follow, then one write."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.held: list[bytes] = []

    async def send(self, response: Response, keep_alive_10: bool = False, hold: bool = False) -> None:
        """Write ``response`` after what is held; with ``hold``, a small one may wait for the next."""
        head, body = _render(response, keep_alive_10 and not response.close)
        if len(body) < _LARGE:
            self.held.append(head + body)  # one segment for head and body, whatever Nagle does
            if not hold or len(self.held) >= _HELD_MAX:
                await self.flush()
            return
        self.held.append(head)
        await self.flush()
        self.writer.write(body)
        await self.writer.drain()

    async def flush(self) -> None:
        if self.held:
            self.writer.write(self.held[0] if len(self.held) == 1 else b"".join(self.held))
            self.held.clear()
            await self.writer.drain()


def _render(response: Response, keep_alive_10: bool) -> tuple[bytes, bytes]:
    """The head and the body of an answer."""
    reason = HTTPStatus(response.status).phrase if response.status in HTTPStatus._value2member_map_ else ""
    lines = [f"HTTP/1.1 {response.status} {reason}", f"Date: {_date()}", f"Content-Type: {response.content_type}",
             f"Content-Length: {len(response.body)}"]
    lines += [f"{key}: {value}" for key, value in response.headers.items()]
    if response.close:
        lines.append("Connection: close")
    elif keep_alive_10:
        lines.append("Connection: keep-alive")  # an HTTP/1.0 client closes unless told otherwise
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head, b"" if response.head_only else response.body


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Half-close, then drain what the client still sends so closing does not reset it."""
    if not writer.can_write_eof():
        return
    with contextlib.suppress(Exception):
        writer.write_eof()

        async def drain() -> None:
            total = 0
            while total < _LINGER_BYTES:
                chunk = await reader.read(2**16)
                if not chunk:
                    return
                total += len(chunk)

        await within(_LINGER_S, drain())


def _peer(writer: asyncio.StreamWriter) -> str:
    info = writer.get_extra_info("peername")
    return str(info[0]) if isinstance(info, tuple) else str(info)
