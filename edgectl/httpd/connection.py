"""One client connection of a host HTTP server: its requests in turn, each step under a time limit.

A connection costs a coroutine and a socket, never a thread: a client that sends nothing, or its
head one line at a time, is answered 408 and closed ``header_timeout_s`` after it connected (or
after the first byte of a later request); a kept-alive connection is closed after
``idle_timeout_s`` without a request; a body must arrive within ``body_timeout_s`` plus its
length at ``min_body_bytes_per_s``; an answer's every piece must leave within
``send_timeout_s``. The application reads a body only after it admitted the request (who may
call, how large it may be), so a refusal costs no memory; a body left unread closes the
connection, since what follows it could not be told from the next request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from email.utils import formatdate
from http import HTTPStatus
from pathlib import Path
from typing import BinaryIO

from edgectl.httpd.limits import ServerLimits
from edgectl.httpd.request import HttpError, RequestHead, parse_head

__all__ = ["Body", "ErrorPage", "FileBody", "Handler", "Reply", "linger", "serve_connection", "write_reply"]

log = logging.getLogger(__name__)

PIECE = 8 << 20  # bytes of a file sent under one send timeout
READ = 1 << 16
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


@dataclass
class FileBody:
    """A byte range of an open file sent as the body (``sendfile`` on plain connections); closed once sent."""

    file: BinaryIO
    offset: int
    count: int
    rate: int | None = None  # bytes/s of this answer; None: as fast as it goes
    on_sent: Callable[[int, int], None] | None = None  # (offset, bytes that left), once, also when cut short


@dataclass
class Reply:
    """An answer: ``body``, or ``file`` sent after the head; ``close`` ends the connection after it."""

    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: Mapping[str, str] = field(default_factory=dict)
    file: FileBody | None = None
    close: bool = False


class Body:
    """A request's body, read only when the application asks for it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: RequestHead,
                 limits: ServerLimits) -> None:
        self.reader, self.writer, self.head, self.limits = reader, writer, head, limits
        self.consumed = False

    @property
    def unread(self) -> bool:
        """Whether bytes of this body are still on the connection."""
        return not self.consumed and (self.head.chunked or self.head.content_length > 0)

    def _admit(self, limit: int) -> int:
        if self.head.chunked:
            raise HttpError(411, "send the body with a Content-Length (chunked transfer encoding is not accepted)")
        length = self.head.content_length
        if length > limit:
            raise HttpError(413, f"the body is {length} bytes, over the limit of {limit}")
        return length

    async def _begin(self, length: int) -> float:
        """Ask for the body when the client waits to be asked (``Expect: 100-continue``); its deadline."""
        if length and self.head.headers.get("expect", "").lower() == "100-continue":
            self.writer.write(CONTINUE)
        return self.limits.body_deadline_s(length)

    async def read(self, limit: int) -> bytes:
        """The whole body (at most ``limit`` bytes, else 413 before reading any)."""
        length = self._admit(limit)
        if not length:
            self.consumed = True
            return b""
        try:
            async with asyncio.timeout(await self._begin(length)):
                data = await self.reader.readexactly(length)
        except TimeoutError:
            raise HttpError(408, f"the body did not arrive within {self.limits.body_deadline_s(length):.0f} s") from None
        except asyncio.IncompleteReadError:
            raise ConnectionResetError("the client went away in the middle of its body") from None
        self.consumed = True
        return data

    async def save(self, path: Path, limit: int) -> int:
        """Stream the body into ``path`` (at most ``limit`` bytes, else 413 before reading any); its length."""
        length = self._admit(limit)
        left = length
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(await self._begin(length)):
                with path.open("wb") as out:
                    while left:
                        data = await self.reader.read(min(READ * 16, left))
                        if not data:
                            raise HttpError(400, f"body: ended after {length - left} of {length} bytes")
                        await loop.run_in_executor(None, out.write, data)
                        left -= len(data)
        except TimeoutError:
            raise HttpError(408, f"the body did not arrive within {self.limits.body_deadline_s(length):.0f} s") from None
        self.consumed = True
        return length


Handler = Callable[[RequestHead, Body], Awaitable[Reply]]
ErrorPage = Callable[[HttpError], Reply]


async def serve_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, handler: Handler,
                           error_page: ErrorPage, limits: ServerLimits, peer: str) -> None:
    """Serve one connection's requests in turn until it closes, times out or misbehaves."""
    first = True
    while True:
        head: RequestHead | None = None
        body: Body | None = None
        try:
            raw = await _read_head(reader, limits, first)
            if raw is None:
                return
            head = parse_head(raw, peer)
            expect = head.headers.get("expect")
            if expect is not None and expect.lower() != "100-continue":
                raise HttpError(417, f"Expect '{expect[:60]}' is not supported; only 100-continue is")
            body = Body(reader, writer, head, limits)
            reply = await handler(head, body)
        except HttpError as exc:
            reply = error_page(exc)
            reply.close = reply.close or exc.close
        except (ConnectionError, OSError):
            raise
        except Exception:
            log.exception("%s %s from %s failed", head.method if head else "request", head.target if head else "", peer)
            reply = error_page(HttpError(500, "internal error (see the server log)"))
        first = False
        if head is None or not head.keep_alive or (body is not None and body.unread):
            reply.close = True
        await write_reply(writer, reply, limits, head_only=head is not None and head.method == "HEAD",
                          keep_alive_10=head is not None and head.version == "1.0")
        if reply.close:
            return


async def _read_head(reader: asyncio.StreamReader, limits: ServerLimits, first: bool) -> bytes | None:
    """The next request's line and headers; None when the client closed or idled out between requests."""
    start = b""
    if not first:
        try:
            async with asyncio.timeout(limits.idle_timeout_s):
                start = await reader.read(1)
        except TimeoutError:
            return None
        if not start:
            return None
    try:
        async with asyncio.timeout(limits.header_timeout_s):
            return start + await reader.readuntil(b"\r\n\r\n")
    except TimeoutError:
        raise HttpError(408, f"the request head did not arrive within {limits.header_timeout_s:g} s") from None
    except asyncio.LimitOverrunError:
        raise HttpError(431, f"the request head is over {limits.max_header_bytes} bytes") from None
    except asyncio.IncompleteReadError as exc:
        if first and not exc.partial:
            return None  # connected and left without a word
        raise ConnectionResetError("the client went away in the middle of a request head") from None


def _date() -> str:
    return formatdate(time.time(), usegmt=True)


def _head(reply: Reply, length: int, keep_alive_10: bool) -> bytes:
    reason = HTTPStatus(reply.status).phrase if reply.status in HTTPStatus._value2member_map_ else ""
    lines = [f"HTTP/1.1 {reply.status} {reason}", f"Date: {_date()}", f"Content-Type: {reply.content_type}",
             f"Content-Length: {length}", *(f"{key}: {value}" for key, value in reply.headers.items())]
    if reply.close:
        lines.append("Connection: close")
    elif keep_alive_10:
        lines.append("Connection: keep-alive")  # an HTTP/1.0 client closes unless told otherwise
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def write_reply(writer: asyncio.StreamWriter, reply: Reply, limits: ServerLimits, head_only: bool = False,
                      keep_alive_10: bool = False) -> None:
    """Send ``reply`` (its head only for HEAD); each piece must leave within the send timeout."""
    length = reply.file.count if reply.file is not None else len(reply.body)
    head = _head(reply, length, keep_alive_10)
    if reply.file is None:
        writer.write(head if head_only else head + reply.body)  # one write: no small segment waits for an ACK
    else:
        writer.write(head)
        try:
            if not head_only and reply.file.count:
                await _send_file(writer, reply.file, limits)
        finally:
            reply.file.file.close()
    async with asyncio.timeout(limits.send_timeout_s):
        await writer.drain()


async def _send_file(writer: asyncio.StreamWriter, body: FileBody, limits: ServerLimits) -> None:
    """Send ``body`` (paced at its rate), then tell its ``on_sent`` how many bytes left."""
    loop = asyncio.get_running_loop()
    piece = PIECE if body.rate is None else max(4096, min(READ, body.rate // 8))
    sent, started = 0, loop.time()
    try:
        while sent < body.count:
            async with asyncio.timeout(limits.send_timeout_s):
                n = await loop.sendfile(writer.transport, body.file, body.offset + sent, min(piece, body.count - sent))
            if n == 0:  # the file shrank under us
                raise ConnectionAbortedError("the file ended before the range it was asked for")
            sent += n
            if body.rate is not None:
                await asyncio.sleep(max(0.0, sent / body.rate - (loop.time() - started)))
    finally:
        if body.on_sent is not None:
            body.on_sent(body.offset, sent)


async def linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seconds: float = 1.0) -> None:
    """Half-close, then drain what the client still sends for a moment, so closing does not reset its read."""
    with contextlib.suppress(Exception):
        if writer.can_write_eof():
            writer.write_eof()
        async with asyncio.timeout(seconds):
            while await reader.read(READ):
                pass
