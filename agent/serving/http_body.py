"""Reading a request's body off the connection: a ``Content-Length`` body in one read, a chunked one chunk by chunk.

Both run on the serving loop within a time limit. A chunked body is fed to its llhttp parser
(``http_head.Incoming``), which decides its framing; each chunk is held in the byte budget under
``request.reserved`` as it arrives (the caller releases it whatever happens), and the whole is
capped at ``max_bytes``.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable
from typing import TypeVar

from agent.serving.budget import ByteBudget
from agent.serving.http_head import BadRequest, Incoming, Request

__all__ = ["BodyRefused", "ClientGone", "discard", "read_body", "read_chunked", "within"]

_BODY_LIMIT_MAX = 4 * 2**20  # a body up to twice this is read without flow-control pauses

T = TypeVar("T")

if sys.version_info >= (3, 11):

    async def within(seconds: float, awaitable: Awaitable[T]) -> T:
        """``await awaitable``, raising TimeoutError after ``seconds`` (a scope: no extra task)."""
        async with asyncio.timeout(seconds):
            return await awaitable

else:

    async def within(seconds: float, awaitable: Awaitable[T]) -> T:
        try:
            return await asyncio.wait_for(awaitable, seconds)
        except asyncio.TimeoutError:
            raise TimeoutError from None


class ClientGone(Exception):
    """The client went away, stalled past a limit or broke the framing: drop the connection quietly."""


class BodyRefused(Exception):
    """A chunked body outgrew a limit while it arrived: answer ``status`` and close."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def read_body(reader: asyncio.StreamReader, length: int, timeout: float) -> bytes:
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
        return await within(timeout, reader.readexactly(length))
    except TimeoutError:
        raise ClientGone from None
    finally:
        if isinstance(header_limit, int):
            setattr(reader, "_limit", header_limit)  # noqa: B010


async def discard(reader: asyncio.StreamReader, length: int, timeout: float) -> None:
    """Read and drop ``length`` bytes (a refused request's body), within ``timeout``."""
    async def drain() -> None:
        left = length
        while left > 0:
            chunk = await reader.read(min(left, 2**20))
            if not chunk:
                raise ClientGone
            left -= len(chunk)

    try:
        await within(timeout, drain())
    except TimeoutError:
        raise ClientGone from None


async def read_chunked(reader: asyncio.StreamReader, request: Request, incoming: Incoming, max_bytes: int,
                       budget: ByteBudget, timeout: float) -> bytes:
    """A chunked body, within ``timeout``; BodyRefused past ``max_bytes`` or when the budget cannot hold a chunk."""
    try:
        await within(timeout, _read_chunks(reader, request, incoming, max_bytes, budget))
    except TimeoutError:
        raise ClientGone from None
    body = b"".join(incoming.chunks)
    incoming.chunks.clear()
    return body


async def _read_chunks(reader: asyncio.StreamReader, request: Request, incoming: Incoming, max_bytes: int,
                       budget: ByteBudget) -> None:
    """Feed chunk lines and data to llhttp until the message ends, reserving each chunk in the budget.

    Each read asks for exactly what llhttp needs next (a size line, that many bytes and CRLF, the
    trailer lines), so the next pipelined request stays in the reader. A chunk's size is read from
    its line only after llhttp accepted the line.
    """
    received = 0
    trailers = False
    while not incoming.message_done:
        line = await _line(reader)
        incoming.feed(line)
        if trailers or incoming.message_done:
            continue
        size = int(line.split(b";", 1)[0], 16)
        if size == 0:
            trailers = True  # the last chunk: trailer lines follow, up to the blank one
            continue
        received += size
        if received > max_bytes:
            raise BodyRefused(413, f"chunked request exceeds the limit of {max_bytes} bytes")
        if not budget.try_reserve(size):
            raise BodyRefused(503, "too many bytes in flight; retry later")
        request.reserved += size
        incoming.feed(await reader.readexactly(size + 2))


async def _line(reader: asyncio.StreamReader) -> bytes:
    try:
        return await reader.readuntil(b"\r\n")
    except asyncio.LimitOverrunError:
        raise BadRequest("chunk size or trailer line too long") from None
