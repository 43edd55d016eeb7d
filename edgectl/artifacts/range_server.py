"""Serving a directory of artifacts over HTTP(S) with byte ranges: ``edgectl artifacts serve``.

GET and HEAD of the regular files under one directory, nothing else: a single ``Range: bytes=``
range answers 206 with ``Content-Range``, an unsatisfiable one 416, a malformed or multi-range
header the whole file (200, as RFC 9110 allows). Paths are decoded, resolved and must stay inside
the directory (``..``, absolute paths and links leading out are 404); there is no listing. The
query string is ignored, so URLs shaped like presigned ones work. Bodies go out with sendfile.
"""

from __future__ import annotations

import logging
import os
import re
import ssl
import threading
import time
import urllib.parse
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import BinaryIO

__all__ = ["RangeNotSatisfiable", "RangeServer", "parse_range"]

log = logging.getLogger(__name__)

RANGE = re.compile(r"bytes=(\d*)-(\d*)")


class RangeNotSatisfiable(ValueError):
    """The range starts past the end of the file (416)."""


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """The inclusive byte span a Range header asks for; None: serve the whole file. Raises RangeNotSatisfiable."""
    if header is None:
        return None
    match = RANGE.fullmatch(header.strip())
    if match is None or (not match[1] and not match[2]):
        return None  # malformed, another unit or several ranges: ignored, the whole file is served
    if not match[1]:  # bytes=-N: the last N bytes
        suffix = int(match[2])
        if suffix == 0 or size == 0:
            raise RangeNotSatisfiable(header)
        return max(0, size - suffix), size - 1
    first = int(match[1])
    last = int(match[2]) if match[2] else size - 1
    if match[2] and last < first:
        return None  # invalid: ignored
    if first >= size:
        raise RangeNotSatisfiable(header)
    return first, min(last, size - 1)


class RangeServer:
    """A threaded HTTP(S) server over ``root``; ``bytes_sent`` and ``requests`` count what it served."""

    def __init__(self, root: Path, host: str = "127.0.0.1", port: int = 0, tls: ssl.SSLContext | None = None,
                 rate: int | None = None) -> None:
        """``rate``: bytes/s per response (spares an origin's uplink; tests use it to stop a server mid-body)."""
        self.root = root.resolve()
        self.rate = rate
        if not self.root.is_dir():
            raise NotADirectoryError(f"{root} is not a directory")
        self.bytes_sent = 0
        self.requests = 0
        self.served: list[tuple[int, int]] = []  # (first byte, bytes sent) of every body, in order
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer((host, port), _handler_for(self))
        self._httpd.daemon_threads = True
        if tls is not None:
            self._httpd.socket = tls.wrap_socket(self._httpd.socket, server_side=True)
        self._thread: threading.Thread | None = None
        self.scheme = "https" if tls is not None else "http"

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"{self.scheme}://{host!s}:{port}"

    def url_of(self, name: str) -> str:
        return f"{self.url}/{urllib.parse.quote(name)}"

    def count(self, offset: int, sent: int) -> None:
        with self._lock:
            self.bytes_sent += sent
            self.served.append((offset, sent))

    def start(self) -> RangeServer:
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="range-server", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._httpd.serve_forever()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(5)

    def resolve(self, raw_path: str) -> Path | None:
        """The file a request path names, or None: absent, not a regular file, or outside the root."""
        path = urllib.parse.unquote(urllib.parse.urlsplit(raw_path).path)
        if "\x00" in path:
            return None
        target = (self.root / path.lstrip("/")).resolve()
        if not target.is_relative_to(self.root) or not target.is_file():
            return None
        return target


def _handler_for(server: RangeServer) -> type[BaseHTTPRequestHandler]:
    class Handler(_RangeHandler):
        owner = server

    return Handler


class _RangeHandler(BaseHTTPRequestHandler):
    owner: RangeServer
    protocol_version = "HTTP/1.1"  # keep-alive: a device asks for many ranges on one connection
    server_version = "edgectl-artifacts"

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)

    def _answer(self, body: bool) -> None:
        with self.owner._lock:
            self.owner.requests += 1
        path = self.owner.resolve(self.path)
        if path is None:
            return self._plain(HTTPStatus.NOT_FOUND, b"not found\n", body)
        with path.open("rb") as f:
            size = path.stat().st_size
            try:
                span = parse_range(self.headers.get("Range"), size)
            except RangeNotSatisfiable:
                return self._plain(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE, b"", body, {"Content-Range": f"bytes */{size}"})
            first, last = (0, size - 1) if span is None else span
            length = last - first + 1 if size else 0
            self.send_response(HTTPStatus.OK if span is None else HTTPStatus.PARTIAL_CONTENT)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", str(length))
            if span is not None:
                self.send_header("Content-Range", f"bytes {first}-{last}/{size}")
            self.end_headers()
            if body and length:
                self.owner.count(first, self._send_file(f, first, length))

    def _send_file(self, f: BinaryIO, offset: int, count: int) -> int:
        """Send ``count`` bytes from ``offset``; the bytes that left, also when the client goes away mid-body."""
        sent, sock, rate = 0, self.connection, self.owner.rate
        step = 1 << 20 if rate is None else max(4096, min(64 * 1024, rate // 8))
        started = time.monotonic()
        try:
            while sent < count:
                if isinstance(sock, ssl.SSLSocket):  # TLS: the kernel cannot send the file itself
                    f.seek(offset + sent)
                    block = f.read(min(step, count - sent))
                    sock.sendall(block)
                    n = len(block)
                else:
                    n = os.sendfile(sock.fileno(), f.fileno(), offset + sent, min(step, count - sent) if rate else count - sent)
                if n == 0:  # the file shrank under us
                    break
                sent += n
                if rate is not None:
                    time.sleep(max(0.0, sent / rate - (time.monotonic() - started)))
        except OSError:
            self.close_connection = True
        return sent

    def _plain(self, status: HTTPStatus, text: bytes, body: bool, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(text)))
        self.end_headers()
        if body and text:
            self.wfile.write(text)

    def log_message(self, format: str, *args: object) -> None:
        log.debug("%s %s", self.address_string(), format % args)
