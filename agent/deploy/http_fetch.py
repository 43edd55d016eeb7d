"""Fetching an artifact's signed chunks by HTTP(S) Range from the URLs its desired state names.

Each URL serves the payload's exact bytes (an origin, a CDN, an S3 presigned URL). The missing
chunks are asked for as byte ranges, one request per run of missing chunks on one kept-alive
connection; every chunk is checked against its signed sha256 by :class:`Download`, exactly as
chunks from MQTT are, and written at its offset into the same ``.part`` file, so a restart resumes
with what landed whatever path it came by. A URL that fails (refused, reset, a timeout, an HTTP
error, a wrong size, one chunk whose hash does not match) is given up for this fetch and the next
is tried; what no URL could give is left for the MQTT chunk path.

Only the standard library: ``http.client`` and ``ssl``. Redirects (S3, CDNs) are followed.
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import queue
import re
import socket
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from agent.deploy.download import Download
from agent.errors import EdgeError

__all__ = ["HttpFetch", "HttpSettings", "RateLimit", "SourceFailed"]

log = logging.getLogger(__name__)

MAX_REDIRECTS = 5
ATTEMPTS_PER_URL = 2  # a second try after a failure that brought no chunk: a dropped keep-alive, a hiccup
PIECE = 64 * 1024  # with a rate cap, bytes are read (and paced) in pieces of at most this
WRITE_AHEAD = 32  # chunks received but not yet checked and written
CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


class SourceFailed(EdgeError):
    """One URL cannot give (good) chunks of this artifact; the next source is tried."""


@dataclass(frozen=True)
class HttpSettings:
    max_bytes_per_s: int | None = None  # None: no cap
    timeout_s: float = 15.0
    ca_file: Path | None = None  # None: the system trust store


class RateLimit:
    """Keeps the average rate at or below ``rate`` bytes/s; a long stall does not bank a burst."""

    def __init__(self, rate: int | None, stop: threading.Event) -> None:
        self.rate = rate
        self.stop = stop
        self._start = time.monotonic()
        self._sent = 0

    def piece(self, remaining: int) -> int:
        """How many bytes to read next: everything when uncapped, else a small piece to pace."""
        return remaining if self.rate is None else min(remaining, PIECE, max(1024, self.rate // 4))

    def spend(self, n: int) -> None:
        if self.rate is None:
            return
        self._sent += n
        ahead = self._sent / self.rate - (time.monotonic() - self._start)
        if ahead > 0:
            self.stop.wait(ahead)
        elif ahead < -1.0:  # behind by more than a second (a stall): start counting afresh
            self._start, self._sent = time.monotonic(), 0


class _Connection:
    """One kept-alive connection to the host of the current URL; reopened when the server closes it."""

    def __init__(self, settings: HttpSettings) -> None:
        self.settings = settings
        self._conn: http.client.HTTPConnection | None = None
        self._origin: tuple[str, str, int] | None = None
        self._context: ssl.SSLContext | None = None
        self._lock = threading.Lock()

    def request(self, url: str, headers: dict[str, str]) -> http.client.HTTPResponse:
        parts = urllib.parse.urlsplit(url)
        scheme, host = parts.scheme, parts.hostname or ""
        origin = (scheme, host, parts.port or (443 if scheme == "https" else 80))
        with self._lock:
            if self._conn is None or self._origin != origin:
                self.close_locked()
                self._conn, self._origin = self._open(*origin), origin
            conn = self._conn
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        conn.request("GET", target, headers={"User-Agent": "edge-agent", **headers})
        return conn.getresponse()

    def _open(self, scheme: str, host: str, port: int) -> http.client.HTTPConnection:
        timeout = self.settings.timeout_s
        if scheme == "https":
            if self._context is None:
                ca = self.settings.ca_file
                self._context = ssl.create_default_context(cafile=str(ca) if ca else None)
            return http.client.HTTPSConnection(host, port, timeout=timeout, context=self._context)
        return http.client.HTTPConnection(host, port, timeout=timeout)

    def abort(self) -> None:
        """From another thread: break a blocked read (cancel), so the fetch notices at once."""
        with self._lock:
            sock = self._conn.sock if self._conn is not None else None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        with self._lock:
            self.close_locked()

    def close_locked(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn, self._origin = None, None


class HttpFetch:
    """Fills a :class:`Download` from HTTP(S) URLs; ``bytes_received`` counts every payload byte read."""

    def __init__(self, settings: HttpSettings) -> None:
        self.settings = settings
        self.stop = threading.Event()  # set by cancel(); cleared when a fetch starts
        self.bytes_received = 0
        self._conn = _Connection(settings)

    def cancel(self) -> None:
        self.stop.set()
        self._conn.abort()

    def fetch(self, download: Download, urls: tuple[str, ...] | list[str]) -> bool:
        """Try each URL in turn until ``download`` is complete; True if it is. Never raises for a bad source."""
        limit = RateLimit(self.settings.max_bytes_per_s, self.stop)
        try:
            for url in urls:
                if download.complete or self.stop.is_set():
                    break
                self._from(download, url, limit)
        finally:
            self._conn.close()
        return download.complete

    def _from(self, download: Download, url: str, limit: RateLimit) -> None:
        start_have, start_bytes, started = len(download.have), self.bytes_received, time.monotonic()
        failures = 0
        while not download.complete and not self.stop.is_set():
            before = len(download.have)
            try:
                url = self._fill(download, url, limit)
                failures = 0
                if len(download.have) == before and not self.stop.is_set():
                    raise SourceFailed("answered without a whole chunk")
            except SourceFailed as exc:
                log.warning("artifact %s from %s: %s; trying the next source", download.payload.sha256[:12], _safe(url), exc)
                return
            except (OSError, http.client.HTTPException) as exc:
                self._conn.close()
                failures = 0 if len(download.have) > before else failures + 1
                if failures >= ATTEMPTS_PER_URL or self.stop.is_set():
                    log.warning("artifact %s from %s: %s; trying the next source", download.payload.sha256[:12],
                                _safe(url), _reason(exc))
                    return
                self.stop.wait(0.5)
        got = len(download.have) - start_have
        if got:
            log.info("artifact %s: %d chunk(s), %d bytes from %s in %.2fs", download.payload.sha256[:12], got,
                     self.bytes_received - start_bytes, _safe(url), time.monotonic() - started)

    def _fill(self, download: Download, url: str, limit: RateLimit) -> str:
        """One request per run of missing chunks; returns the URL redirects led to."""
        for first, end in download.missing():
            if self.stop.is_set():
                break
            url = self._range(download, url, first, end, limit)
            if download.complete:
                break
        return url

    def _range(self, download: Download, url: str, first: int, end: int, limit: RateLimit) -> str:
        size, chunk = download.payload.size, download.payload.chunk_size
        lo, hi = first * chunk, min(end * chunk, size) - 1
        for _ in range(MAX_REDIRECTS + 1):
            response = self._conn.request(url, {"Range": f"bytes={lo}-{hi}"})
            if response.status in (301, 302, 303, 307, 308):
                location = response.getheader("Location")
                response.read()
                if not location:
                    raise SourceFailed(f"HTTP {response.status} without a Location")
                url = urllib.parse.urljoin(url, location)
                continue
            try:
                self._read(download, response, *self._span(response, lo, hi, size, chunk), limit)
            finally:
                if response.will_close or not response.isclosed():  # body left unread: the connection cannot be reused
                    self._conn.close()
            return url
        raise SourceFailed(f"more than {MAX_REDIRECTS} redirects")

    @staticmethod
    def _span(response: http.client.HTTPResponse, lo: int, hi: int, size: int, chunk: int) -> tuple[int, int]:
        """The chunk indices [first, end) the response body holds, from its status and Content-Range."""
        if response.status == 200:  # the Range was ignored: the body is the whole payload
            length = response.getheader("Content-Length")
            if length is not None and int(length) != size:
                raise SourceFailed(f"serves {length} bytes, the signed payload has {size}")
            return 0, -(-size // chunk)
        if response.status != 206:
            raise SourceFailed(f"HTTP {response.status} {response.reason}")
        match = CONTENT_RANGE.fullmatch(response.getheader("Content-Range") or "")
        if match is None:
            raise SourceFailed(f"206 with an unreadable Content-Range {response.getheader('Content-Range')!r}")
        got_lo, got_hi, total = int(match[1]), int(match[2]), match[3]
        if total != "*" and int(total) != size:
            raise SourceFailed(f"serves {total} bytes, the signed payload has {size}")
        if got_lo != lo or got_hi > hi or got_hi < lo:
            raise SourceFailed(f"asked for bytes {lo}-{hi}, got {got_lo}-{got_hi}")
        # A shorter answer than asked for is used up to its last whole chunk.
        return lo // chunk, -(-size // chunk) if got_hi + 1 >= size else (got_hi + 1) // chunk

    def _read(self, download: Download, response: http.client.HTTPResponse, first: int, end: int,
              limit: RateLimit) -> None:
        writer = _Writer(download)
        try:
            for index in range(first, end):
                if self.stop.is_set() or writer.failed is not None:
                    break
                data = self._chunk(response, download.chunk_length(index), limit)
                if len(data) != download.chunk_length(index):
                    raise SourceFailed(f"the body ended early, in chunk {index}")
                writer.put(index, data)
        finally:
            writer.close()

    def _chunk(self, response: http.client.HTTPResponse, length: int, limit: RateLimit) -> bytes:
        if limit.rate is None:
            data = response.read(length)
            self.bytes_received += len(data)
            return data
        pieces = []
        remaining = length
        while remaining and not self.stop.is_set():
            piece = response.read(limit.piece(remaining))
            if not piece:
                break
            pieces.append(piece)
            remaining -= len(piece)
            self.bytes_received += len(piece)
            limit.spend(len(piece))
        return b"".join(pieces)


class _Writer:
    """Checks and writes chunks on its own thread while the next ones arrive (hashlib lets go of the GIL).

    :meth:`close` waits for what was handed over and raises what went wrong: a chunk that does not
    match its signed sha256 (SourceFailed), or the download's own failure (a full disk)."""

    def __init__(self, download: Download) -> None:
        self.download = download
        self.failed: int | None = None  # the first chunk whose hash did not match
        self._error: BaseException | None = None
        self._queue: queue.Queue[tuple[int, bytes] | None] = queue.Queue(maxsize=WRITE_AHEAD)
        self._thread = threading.Thread(target=self._run, name="chunk-writer", daemon=True)
        self._thread.start()

    def put(self, index: int, data: bytes) -> None:
        self._queue.put((index, data))

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()
        if self._error is not None:
            raise self._error
        if self.failed is not None:
            raise SourceFailed(f"chunk {self.failed} does not match its signed sha256")

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            if self.failed is not None or self._error is not None:
                continue  # drain: the reader stops at its next chunk
            index, data = item
            rejected = self.download.rejected
            try:
                if not self.download.accept(index, data) and self.download.rejected > rejected:
                    self.failed = index
            except BaseException as exc:  # handed to the fetching thread by close()
                self._error = exc


def _safe(url: str) -> str:
    """The URL without its query: a presigned URL's signature does not belong in logs."""
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
