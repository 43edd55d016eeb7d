"""Serving a directory of artifacts over HTTP(S) with byte ranges: ``edgectl artifacts serve``.

GET and HEAD of the regular files under one directory, nothing else (405 with ``Allow``). A single
``Range: bytes=`` range answers 206 with ``Content-Range`` and an unsatisfiable one 416; a header
that is malformed, names another unit or several ranges is ignored and the whole file served (200),
as RFC 9110 (14.2) allows. Positions of any size are read as numbers: a first byte past the end is
416, a last byte past it means the end. Paths are decoded, resolved and must stay inside the
directory (``..``, absolute paths and links leading out are 404); there is no listing. The query
string is ignored, so URLs shaped like presigned ones work. Bodies go out with sendfile.

The server is :class:`edgectl.httpd.HttpServer`: header, idle and send timeouts, connections
bounded per process and per address, TLS handshakes on its loop with a timeout.
"""

from __future__ import annotations

import logging
import re
import ssl
import threading
import urllib.parse
from pathlib import Path

from edgectl.httpd import Body, FileBody, HttpError, HttpServer, Reply, RequestHead, ServerLimits

__all__ = ["ORIGIN_LIMITS", "RangeNotSatisfiable", "RangeServer", "parse_range"]

log = logging.getLogger(__name__)

RANGE = re.compile(r"bytes=([0-9]*)-([0-9]*)", re.ASCII)
# A fleet's devices may share one address (a site behind NAT): more per address than the API allows.
ORIGIN_LIMITS = ServerLimits(max_connections=4096, max_per_address=512, idle_timeout_s=15.0)


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
        suffix = _position(match[2], size)
        if suffix == 0 or size == 0:
            raise RangeNotSatisfiable(header)
        return size - suffix, size - 1
    first = _position(match[1], size)
    last = _position(match[2], size) if match[2] else size - 1
    if match[2] and last < first:
        return None  # invalid: ignored
    if first >= size:
        raise RangeNotSatisfiable(header)
    return first, min(last, size - 1)


def _position(digits: str, size: int) -> int:
    """A byte position as a number, ``size`` standing for any at or past the end (int() refuses 4,300 digits)."""
    significant = digits.lstrip("0")
    return size if len(significant) > len(str(size)) else min(int(significant or "0"), size)


class RangeServer:
    """An HTTP(S) server over ``root``; ``bytes_sent`` and ``requests`` count what it served."""

    def __init__(self, root: Path, host: str = "127.0.0.1", port: int = 0, tls: ssl.SSLContext | None = None,
                 rate: int | None = None, limits: ServerLimits = ORIGIN_LIMITS) -> None:
        """``rate``: bytes/s per response (spares an origin's uplink; tests use it to stop a server mid-body)."""
        self.root = root.resolve()
        self.rate = rate
        if not self.root.is_dir():
            raise NotADirectoryError(f"{root} is not a directory")
        self.bytes_sent = 0
        self.requests = 0
        self.served: list[tuple[int, int]] = []  # (first byte, bytes sent) of every body, in order
        self._lock = threading.Lock()
        self.http = HttpServer(host, port, self._answer, _plain_error, tls, limits, "range-server")
        self.scheme = "https" if tls is not None else "http"

    @property
    def url(self) -> str:
        return self.http.url

    def url_of(self, name: str) -> str:
        return f"{self.url}/{urllib.parse.quote(name)}"

    def count(self, offset: int, sent: int) -> None:
        with self._lock:
            self.bytes_sent += sent
            self.served.append((offset, sent))

    def start(self) -> RangeServer:
        self.http.start()
        return self

    def serve_forever(self) -> None:
        self.http.serve_forever()

    def stop(self) -> None:
        self.http.stop()

    def resolve(self, raw_path: str) -> Path | None:
        """The file a request path names, or None: absent, not a regular file, or outside the root."""
        path = urllib.parse.unquote(urllib.parse.urlsplit(raw_path).path)
        if "\x00" in path:
            return None
        target = (self.root / path.lstrip("/")).resolve()
        if not target.is_relative_to(self.root) or not target.is_file():
            return None
        return target

    async def _answer(self, head: RequestHead, _body: Body) -> Reply:
        with self._lock:
            self.requests += 1
        if head.method not in ("GET", "HEAD"):
            raise HttpError(405, f"{head.method} is not served here: GET or HEAD a file", {"Allow": "GET, HEAD"},
                            close=False)
        path = self.resolve(head.target)
        if path is None:
            return _plain(404, b"not found\n")
        f = path.open("rb")
        size = path.stat().st_size
        try:
            span = parse_range(head.headers.get("range"), size)
        except RangeNotSatisfiable:
            f.close()
            return _plain(416, b"", {"Content-Range": f"bytes */{size}"})
        first, last = (0, size - 1) if span is None else span
        headers = {"Accept-Ranges": "bytes", **({"Content-Range": f"bytes {first}-{last}/{size}"} if span else {})}
        body = FileBody(f, first, last - first + 1 if size else 0, self.rate, self.count)
        return Reply(200 if span is None else 206, content_type="application/octet-stream", headers=headers, file=body)


def _plain(status: int, text: bytes, headers: dict[str, str] | None = None) -> Reply:
    return Reply(status, text, "text/plain", headers or {})


def _plain_error(exc: HttpError) -> Reply:
    return _plain(exc.status, exc.message.encode() + b"\n", exc.headers)
