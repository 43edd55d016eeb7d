"""A bounded HTTP/1.1 server on its own asyncio loop: the REST API and the artifact origin run on it.

The socket is bound when the server is made (a busy port is an OSError there); ``start()`` serves
from a thread, ``serve_forever()`` until ``stop()``. Each connection is admitted (process and
per-address limits, :mod:`edgectl.httpd.limits`) before its TLS handshake, which then runs on the
loop under ``handshake_timeout_s``: a client that connects and says nothing delays no other.
When accept() finds no descriptor left (EMFILE), asyncio stops accepting for a second instead of
spinning.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import threading

from edgectl.httpd.connection import ErrorPage, Handler, linger, serve_connection, write_reply
from edgectl.httpd.limits import Occupancy, ServerLimits, descriptor_room
from edgectl.httpd.request import HttpError

__all__ = ["HttpServer"]

log = logging.getLogger(__name__)

BACKLOG = 512
MAX_REFUSING = 64  # refusals answered at once; past that a refused connection is closed without an answer


class HttpServer:
    """Serves ``handler`` on ``host:port`` (TLS when ``tls`` is given) within ``limits``."""

    def __init__(self, host: str, port: int, handler: Handler, error_page: ErrorPage, tls: ssl.SSLContext | None = None,
                 limits: ServerLimits = ServerLimits(), name: str = "http") -> None:
        self.handler, self.error_page, self.tls, self.limits, self.name = handler, error_page, tls, limits, name
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        self.sock = socket.create_server((host, port), family=family, backlog=BACKLOG)
        self.occupancy = Occupancy(limits, descriptor_room())
        self.refused = 0  # connections refused over a limit
        self._refusing = 0  # refusals being answered now
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    @property
    def url(self) -> str:
        host = str(self.sock.getsockname()[0])
        return f"{'https' if self.tls else 'http'}://{f'[{host}]' if ':' in host else host}:{self.port}"

    def start(self) -> HttpServer:
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name=self.name, daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def serve_forever(self) -> None:
        """Serve until :meth:`stop` (from a signal handler or another thread)."""
        self.start()
        while not self._stopped.wait(0.5):
            pass

    def stop(self) -> None:
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stopping.set)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(10)
        self.sock.close()
        self._stopped.set()

    def _run(self, ready: threading.Event) -> None:
        loop = self._loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self._serve(ready))
        finally:
            loop.close()
            self._stopped.set()

    async def _serve(self, ready: threading.Event) -> None:
        self._stopping = asyncio.Event()
        server = await asyncio.start_server(self._connected, sock=self.sock, limit=self.limits.max_header_bytes)
        ready.set()
        try:
            await self._stopping.wait()
        finally:
            server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        peer = _peer(writer)
        sock = writer.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):  # answers leave at once, not after the client's delayed ACK
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        refused = self.occupancy.enter(peer)
        try:
            if refused is not None:
                await self._refuse(reader, writer, peer, refused)
            elif await self._handshake(writer, peer):
                await serve_connection(reader, writer, self.handler, self.error_page, self.limits, peer)
        except (ConnectionError, OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
            log.debug("%s: connection from %s ended: %s", self.name, peer, exc)
        except Exception:
            log.exception("%s: connection from %s failed", self.name, peer)
        finally:
            if refused is None:
                self.occupancy.leave(peer)
                writer.close()
            else:
                writer.transport.abort()
            self._tasks.discard(task)

    async def _refuse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str, why: str) -> None:
        """Over a limit: a plain client gets 503 with Retry-After (a TLS one, which cannot read it, a close)."""
        self.refused += 1
        log.debug("%s: refused a connection from %s: %s", self.name, peer, why)
        if self.tls is not None or self._refusing >= MAX_REFUSING:
            return
        self._refusing += 1
        try:
            reply = self.error_page(HttpError(503, f"too many connections: {why}; retry later", {"Retry-After": "1"}))
            reply.close = True
            await write_reply(writer, reply, self.limits)
            await linger(reader, writer, 0.25)
        finally:
            self._refusing -= 1

    async def _handshake(self, writer: asyncio.StreamWriter, peer: str) -> bool:
        if self.tls is None:
            return True
        try:
            await writer.start_tls(self.tls, ssl_handshake_timeout=self.limits.handshake_timeout_s)
        except (ssl.SSLError, ConnectionError, OSError, TimeoutError) as exc:
            log.debug("%s: TLS handshake with %s failed: %s", self.name, peer, exc)
            return False
        return True


def _peer(writer: asyncio.StreamWriter) -> str:
    info = writer.get_extra_info("peername")
    return str(info[0]) if isinstance(info, tuple) else str(info)
