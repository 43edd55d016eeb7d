"""A small HTTP/1.1 server on asyncio: bounded, time-limited, never a thread per connection.

Connections live on one event loop: a client that never finishes its headers (slowloris) costs a
coroutine and a socket, not a thread, and is cut after ``header_timeout_s``. Request bodies are
read on the loop under ``body_timeout_s`` after their size is reserved in a shared byte budget
(``max_inflight_bytes``); the handler then runs the request. What cannot be served now (budget,
connection cap) gets a 503 with ``Retry-After``; what can never be served gets a 413/431. A
response that closes the connection half-closes it and drains what the client still sends
(a "lingering close"), so clients see the answer instead of a TCP reset.

Per request the loop does as little as it can (it is the one thread every request passes through):
time limits are ``asyncio.timeout`` scopes rather than ``wait_for`` tasks, and a body, whose bytes
the budget already holds, is read without the header limit's flow control, which would otherwise
pause and resume the socket every 128 KiB (see ``_read_body``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import sys
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import TypeVar

__all__ = ["ByteBudget", "HttpLimits", "Request", "Response", "serve_connection"]

log = logging.getLogger(__name__)

_LINGER_S = 2.0
_LINGER_BYTES = 64 * 2**20
_BODY_LIMIT_MAX = 4 * 2**20  # a body up to twice this is read without flow-control pauses

T = TypeVar("T")

if sys.version_info >= (3, 11):

    async def _within(seconds: float, awaitable: Awaitable[T]) -> T:
        """``await awaitable``, raising TimeoutError after ``seconds`` (a scope: no extra task)."""
        async with asyncio.timeout(seconds):
            return await awaitable

else:

    async def _within(seconds: float, awaitable: Awaitable[T]) -> T:
        try:
            return await asyncio.wait_for(awaitable, seconds)
        except asyncio.TimeoutError:
            raise TimeoutError from None


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
class Request:
    """One parsed request; header names are lower case."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes = b""
    peer: str = ""
    reserved: int = 0  # bytes held in the budget for this request; the handler may add more


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


class ByteBudget:
    """Bytes held by requests in flight, capped; thread-safe (workers release)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._lock = threading.Lock()

    def try_reserve(self, amount: int) -> bool:
        """Reserve ``amount`` bytes if they fit under the limit."""
        with self._lock:
            if self.used + amount > self.limit:
                return False
            self.used += amount
            return True

    def release(self, amount: int) -> None:
        """Give back what try_reserve took."""
        with self._lock:
            self.used -= amount


Handler = Callable[[Request], Awaitable[Response]]
Admit = Callable[[Request, int], Response | None]


class _Closed(Exception):
    """The client went away or broke the framing: drop the connection quietly."""


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
    sock = writer.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        if over_capacity:
            await _send(writer, error(503, "too many connections; retry later", {"Retry-After": "1"}, close=True))
            await _linger(reader, writer)
            return
        while True:
            request = await _read_head(reader, writer, limits, peer)
            if request is None:
                return
            response = await _serve_one(reader, writer, request, limits, budget, admit, handler)
            await _send(writer, response)
            if response.close:
                await _linger(reader, writer)
                return
    except (_Closed, ConnectionError, asyncio.IncompleteReadError):
        pass
    except Exception:
        log.exception("connection from %s failed", peer)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def _serve_one(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    request: Request,
    limits: HttpLimits,
    budget: ByteBudget,
    admit: Admit,
    handler: Handler,
) -> Response:
    length, problem = _content_length(request, limits)
    if problem is not None:
        return problem
    refusal = admit(request, length)
    if refusal is not None:
        # Read and drop the body so the connection stays usable; a refusal costs no memory.
        await _discard(reader, length, limits.body_timeout_s)
        return refusal
    try:
        if length:
            request.body = await _read_body(reader, length, limits.body_timeout_s)
        response = await handler(request)
    finally:
        budget.release(request.reserved)
    if request.headers.get("connection", "").lower() == "close":
        response.close = True
    return response


async def _read_head(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, limits: HttpLimits, peer: str
) -> Request | None:
    """The next request's line and headers; None when the client closed or idled out."""
    try:
        first = await _within(limits.idle_timeout_s, reader.read(1))
    except TimeoutError:
        return None
    if not first:
        return None
    try:
        rest = await _within(limits.header_timeout_s, reader.readuntil(b"\r\n\r\n"))
    except TimeoutError:
        await _send(writer, error(408, f"headers not received within {limits.header_timeout_s:g} s", close=True))
        raise _Closed from None
    except asyncio.LimitOverrunError:
        await _send(writer, error(431, f"request headers exceed {limits.max_header_bytes} bytes", close=True))
        raise _Closed from None
    head = (first + rest).decode("latin-1")
    request = _parse_head(head, peer)
    if request is None:
        await _send(writer, error(400, "malformed HTTP request line or header", close=True))
        raise _Closed
    return request


def _parse_head(head: str, peer: str) -> Request | None:
    lines = head.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        return None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            return None
        headers[name.lower()] = value.strip()
    if parts[2] == "HTTP/1.0" and headers.get("connection", "").lower() != "keep-alive":
        headers["connection"] = "close"
    return Request(parts[0], parts[1], headers, peer=peer)


def _content_length(request: Request, limits: HttpLimits) -> tuple[int, Response | None]:
    if "transfer-encoding" in request.headers:
        return 0, error(411, "chunked bodies are not accepted: send Content-Length", close=True)
    raw = request.headers.get("content-length")
    if raw is None:
        return 0, None
    if not raw.isdigit():
        return 0, error(400, f"Content-Length '{raw[:40]}' is not a non-negative integer", close=True)
    length = int(raw)
    if length > limits.max_request_bytes:
        return length, error(413, f"request is {length} bytes; the limit is {limits.max_request_bytes}", close=True)
    return length, None


async def _read_body(reader: asyncio.StreamReader, length: int, timeout: float) -> bytes:
    """The body, within ``timeout``.

    The reader's limit is the header limit (64 KiB), and a StreamReader pauses the socket whenever
    it buffers more than twice its limit: a 600 KB body would pause and resume reading four times,
    each a trip through the loop and two epoll calls. The body's bytes are already reserved in the
    budget, so for its read the limit is raised to half its size (at most ``_BODY_LIMIT_MAX``): the
    buffer then holds the body plus at most one socket read (256 KiB) of what follows it.
    """
    header_limit = getattr(reader, "_limit", None)
    if isinstance(header_limit, int):
        setattr(reader, "_limit", max(header_limit, min((length + 1) // 2, _BODY_LIMIT_MAX)))  # noqa: B010
    try:
        return await _within(timeout, reader.readexactly(length))
    except TimeoutError:
        raise _Closed from None
    finally:
        if isinstance(header_limit, int):
            setattr(reader, "_limit", header_limit)  # noqa: B010


async def _discard(reader: asyncio.StreamReader, length: int, timeout: float) -> None:
    async def drain() -> None:
        left = length
        while left > 0:
            chunk = await reader.read(min(left, 2**20))
            if not chunk:
                raise _Closed
            left -= len(chunk)

    try:
        await _within(timeout, drain())
    except TimeoutError:
        raise _Closed from None


async def _send(writer: asyncio.StreamWriter, response: Response) -> None:
    reason = HTTPStatus(response.status).phrase if response.status in HTTPStatus._value2member_map_ else ""
    lines = [f"HTTP/1.1 {response.status} {reason}", f"Content-Type: {response.content_type}",
             f"Content-Length: {len(response.body)}"]
    body = b"" if response.head_only else response.body
    lines += [f"{key}: {value}" for key, value in response.headers.items()]
    if response.close:
        lines.append("Connection: close")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    # One write for small answers: head and body in one segment, whatever Nagle does.
    writer.write(head + body if len(body) < 2**16 else head)
    if len(body) >= 2**16:
        writer.write(body)
    await writer.drain()


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

        await _within(_LINGER_S, drain())


def _peer(writer: asyncio.StreamWriter) -> str:
    info = writer.get_extra_info("peername")
    return str(info[0]) if isinstance(info, tuple) else str(info)
