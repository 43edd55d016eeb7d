"""Fetching an artifact's signed chunks by HTTP(S) Range from the URLs its desired state names.

Each URL serves the payload's exact bytes (an origin, a CDN, an S3 presigned URL). The missing
chunks are asked for as byte ranges, one request per run of missing chunks on one kept-alive
connection; every chunk is checked against its signed sha256 by :class:`Download`, exactly as
chunks from MQTT are, and written at its offset into the same ``.part`` file, so a restart resumes
with what landed whatever path it came by. The body is read straight into a few reused blocks of
whole chunks; a second thread checks and writes whatever chunks arrived since its last pass (many
at once while it is busy, each as it comes while it keeps up), so memory stays bounded. A URL that
fails (refused, reset, a timeout, an HTTP error, a wrong size, one chunk whose hash does not match)
is given up for this fetch and the next is tried; what no URL could give is left for the MQTT
chunk path. Each URL's reason is kept in :attr:`HttpFetch.failures` for the event that says why
the device fell back.

A source can neither stall nor steer the device. Every step runs under a :class:`Watchdog`: the
response head (``1xx`` answers included) within ``timeout_s``, each chunk within ``timeout_s``
plus its length at ``min_bytes_per_s``, and nothing past the download's deadline; a stalled URL is
given up at once. Redirects (S3, CDNs) are followed only as :mod:`edgecore.delivery.redirects`
allows, to the address it checked.

Only the standard library: ``http.client`` and ``ssl``.
"""

from __future__ import annotations

import collections
import http.client
import logging
import re
import threading
import time
import urllib.parse

from edgecore.delivery.download import Download
from edgecore.delivery.http_connection import HttpConnection, HttpSettings
from edgecore.delivery.redirects import MAX_REDIRECTS, RedirectPolicy, RedirectRefused
from edgecore.delivery.watchdog import Watchdog
from edgecore.errors import EdgeError

__all__ = ["HttpFetch", "HttpSettings", "RateLimit", "SourceFailed"]

log = logging.getLogger(__name__)

REDIRECTS = (301, 302, 303, 307, 308)
ATTEMPTS_PER_URL = 2  # a second try after a failure that brought no chunk: a dropped keep-alive, a hiccup
PIECE = 64 * 1024  # with a rate cap, bytes are read (and paced) in pieces of at most this
BLOCK_BYTES = 1024 * 1024  # the body is read into blocks of this many bytes of whole chunks (one at least)
WRITE_AHEAD = 3  # blocks at most: one being read, the others waiting to be or being checked and written
CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


class SourceFailed(EdgeError):
    """One URL cannot give (good) chunks of this artifact; the next source is tried."""


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


class HttpFetch:
    """Fills a :class:`Download` from HTTP(S) URLs; ``bytes_received`` counts every payload byte read."""

    def __init__(self, settings: HttpSettings) -> None:
        self.settings = settings
        self.stop = threading.Event()  # set by cancel(); cleared when a fetch starts
        self.bytes_received = 0
        self.failures: list[str] = []  # why each URL of the last fetch was given up ("URL: reason")
        self._conn = HttpConnection(settings)
        self._watchdog: Watchdog | None = None
        self._policy = RedirectPolicy(frozenset())
        self._deadline = float("inf")

    def cancel(self) -> None:
        self.stop.set()
        self._conn.abort()

    def fetch(self, download: Download, urls: tuple[str, ...] | list[str], deadline: float | None = None) -> bool:
        """Try each URL in turn until ``download`` is complete or ``deadline`` (``time.monotonic()``) passes; True if
        it is complete. Never raises for a bad source."""
        limit = RateLimit(self.settings.max_bytes_per_s, self.stop)
        self.failures = []
        self._policy = RedirectPolicy.for_urls(urls, self.settings.redirect_hosts, self.settings.redirect_private)
        self._deadline = float("inf") if deadline is None else deadline
        self._watchdog = Watchdog(self._conn.abort)
        try:
            for url in urls:
                if download.complete or self.stop.is_set():
                    break
                if time.monotonic() >= self._deadline:
                    self.failures.append(f"{_safe(url)}: not tried, the download's deadline passed")
                    continue
                self._from(download, url, limit)
        finally:
            self._watchdog.close()
            self._conn.close()
        return download.complete

    def _from(self, download: Download, url: str, limit: RateLimit) -> None:
        start_have, start_bytes, started = len(download.have), self.bytes_received, time.monotonic()
        failures = 0
        first = url
        while not download.complete and not self.stop.is_set():
            before = len(download.have)
            try:
                url = self._fill(download, url, limit)
                failures = 0
                if len(download.have) == before and not self.stop.is_set():
                    raise SourceFailed("answered without a whole chunk")
            except SourceFailed as exc:  # a cut connection may look like a short body: the stall is the reason
                return self._give_up(download, first, self._stalled() or str(exc))
            except (OSError, http.client.HTTPException) as exc:
                self._conn.close()
                stalled = self._stalled()
                failures = 0 if len(download.have) > before else failures + 1
                if stalled is not None or failures >= ATTEMPTS_PER_URL or self.stop.is_set():
                    return self._give_up(download, first, stalled or _reason(exc))
                self.stop.wait(0.5)
        got = len(download.have) - start_have
        if got:
            log.info("artifact %s: %d chunk(s), %d bytes from %s in %.2fs", download.payload.sha256[:12], got,
                     self.bytes_received - start_bytes, _safe(url), time.monotonic() - started)

    def _give_up(self, download: Download, url: str, why: str) -> None:
        if self.stop.is_set():
            return
        self.failures.append(f"{_safe(url)}: {why}")
        log.warning("artifact %s from %s: %s; trying the next source", download.payload.sha256[:12], _safe(url), why)

    def _stalled(self) -> str | None:
        """Why the watchdog cut the connection, when it did."""
        return self._watchdog.fired if self._watchdog is not None else None

    def _allow(self, seconds: float, reason: str) -> None:
        """Arm the watchdog for the next step: ``seconds``, or less when the download's deadline comes first."""
        assert self._watchdog is not None
        left = self._deadline - time.monotonic()
        if left < seconds:
            seconds, reason = max(0.0, left), "the download's deadline passed"
        self._watchdog.arm(seconds, reason)

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
        address: str | None = None
        assert self._watchdog is not None
        try:
            for _ in range(MAX_REDIRECTS + 1):
                timeout = self.settings.timeout_s
                self._allow(timeout, f"stalled: no response head within {timeout:g} s")
                response = self._conn.request(url, {"Range": f"bytes={lo}-{hi}"}, address)
                if response.status in REDIRECTS:
                    self._conn.close()  # its body is not read: whoever answered chose how long it is
                    url, address = self._redirect(url, response.getheader("Location"), response.status)
                    continue
                try:
                    self._read(download, response, *self._span(response, lo, hi, size, chunk), limit)
                finally:
                    if response.will_close or not response.isclosed():  # body left unread: the connection cannot be reused
                        self._conn.close()
                return url
            raise SourceFailed(f"more than {MAX_REDIRECTS} redirects")
        finally:
            self._watchdog.disarm()

    def _redirect(self, url: str, location: str | None, status: int) -> tuple[str, str | None]:
        """The URL a redirect leads to and the address to connect to; SourceFailed when it may not be followed."""
        if not location:
            raise SourceFailed(f"HTTP {status} without a Location")
        target = urllib.parse.urljoin(url, location.strip())
        try:
            return target, self._policy.check(target)
        except RedirectRefused as exc:
            raise SourceFailed(f"redirect refused: {exc}") from None

    @staticmethod
    def _span(response: http.client.HTTPResponse, lo: int, hi: int, size: int, chunk: int) -> tuple[int, int]:
        """The chunk indices [first, end) the response body holds, from its status and Content-Range."""
        if response.status == 200:  # the Range was ignored: the body is the whole payload
            length = response.getheader("Content-Length")
            if length is not None and length.strip() != str(size):
                raise SourceFailed(f"serves {length[:24]} bytes, the signed payload has {size}")
            return 0, -(-size // chunk)
        if response.status != 206:
            raise SourceFailed(f"HTTP {response.status} {response.reason[:80]}")
        match = CONTENT_RANGE.fullmatch(response.getheader("Content-Range") or "")
        if match is None:
            raise SourceFailed(f"206 with an unreadable Content-Range {(response.getheader('Content-Range') or '')[:80]!r}")
        if any(len(g) > 20 for g in match.groups()):
            raise SourceFailed("206 with a Content-Range past any payload's size")
        got_lo, got_hi, total = int(match[1]), int(match[2]), match[3]
        if total != "*" and int(total) != size:
            raise SourceFailed(f"serves {total} bytes, the signed payload has {size}")
        if got_lo != lo or got_hi > hi or got_hi < lo:
            raise SourceFailed(f"asked for bytes {lo}-{hi}, got {got_lo}-{got_hi}")
        # A shorter answer than asked for is used up to its last whole chunk.
        return lo // chunk, -(-size // chunk) if got_hi + 1 >= size else (got_hi + 1) // chunk

    def _read(self, download: Download, response: http.client.HTTPResponse, first: int, end: int,
              limit: RateLimit) -> None:
        """Chunks [first, end) from the body, read straight into blocks that the writer checks and writes."""
        chunk = download.payload.chunk_size
        per_block = max(1, BLOCK_BYTES // chunk)
        writer = _Writer(download, min(per_block, end - first) * chunk)
        index = first
        try:
            while index < end and not self.stop.is_set() and not writer.halted:
                block = writer.block(index)
                while index < min(end, block.first + per_block) and not self.stop.is_set() and not writer.halted:
                    length = download.chunk_length(index)
                    self._read_chunk(response, index, block.view[block.filled:block.filled + length], limit)
                    writer.filled(block, block.filled + length)
                    index += 1
        finally:
            writer.close()

    def _read_chunk(self, response: http.client.HTTPResponse, index: int, into: memoryview, limit: RateLimit) -> None:
        """Chunk ``index``, whole, into ``into`` within its time: the response timeout plus its length at the floor."""
        floor, length = self.settings.floor, len(into)
        allowed = self.settings.timeout_s + length / floor
        self._allow(allowed, f"stalled: chunk {index} ({length} bytes) took over {allowed:.0f} s (slower than {floor} B/s)")
        if self._chunk(response, into, limit) != length:
            raise SourceFailed(f"the body ended early, in chunk {index}")

    def _chunk(self, response: http.client.HTTPResponse, into: memoryview, limit: RateLimit) -> int:
        """Fill ``into`` from the body (in paced pieces under a rate cap); the bytes read, fewer when it ended."""
        filled = 0
        while filled < len(into) and not self.stop.is_set():
            got = response.readinto(into[filled:filled + limit.piece(len(into) - filled)])
            if not got:
                break
            filled += got
            self.bytes_received += got
            limit.spend(got)
        return filled


class _Block:
    """A buffer the reader fills with whole chunks from ``first`` on; the writer takes them as they come."""

    def __init__(self, first: int, view: memoryview) -> None:
        self.first, self.view = first, view
        self.filled = 0  # bytes of whole chunks read into it
        self.taken = 0  # bytes of them the writer took
        self.sealed = False  # the reader went on to the next block (or stopped): recycled once taken


class _Writer:
    """Checks and writes chunks on its own thread as the reader puts them into blocks (hashlib and pwrite let go
    of the GIL): whatever has arrived since its last pass, in one :meth:`Download.accept_run`, so a busy writer
    takes many chunks at once and an idle one each as it comes (a chunk lands before the next is waited for). At
    most ``WRITE_AHEAD`` blocks exist, so memory stays bounded.

    :meth:`close` waits for what was read and raises what went wrong: a chunk that does not match its signed
    sha256 (SourceFailed), or the download's own failure (a full disk)."""

    def __init__(self, download: Download, size: int) -> None:
        self.download = download
        self.size = size  # bytes per block
        self.failed: int | None = None  # the first chunk whose hash did not match
        self._error: BaseException | None = None
        self._cond = threading.Condition()
        self._blocks: collections.deque[_Block] = collections.deque()  # handed to the reader, in reading order
        self._free: list[memoryview] = []  # blocks the writer is done with: with those in _blocks, all there are
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="chunk-writer", daemon=True)
        self._thread.start()

    @property
    def halted(self) -> bool:
        """A chunk did not match or the download failed: reading on is in vain."""
        return self.failed is not None or self._error is not None

    def block(self, first: int) -> _Block:
        """An empty block to read chunks ``first``, ``first + 1``, ... into: new while fewer than ``WRITE_AHEAD``
        exist, else one the writer is done with (waited for). The block read before it is sealed."""
        with self._cond:
            if self._blocks:
                self._blocks[-1].sealed = True
                self._cond.notify_all()
            while not self._free and len(self._blocks) >= WRITE_AHEAD:
                self._cond.wait()
            self._blocks.append(_Block(first, self._free.pop() if self._free else memoryview(bytearray(self.size))))
            return self._blocks[-1]

    def filled(self, block: _Block, filled: int) -> None:
        """The reader has put whole chunks into ``block`` up to ``filled`` bytes."""
        with self._cond:
            block.filled = filled
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            if self._blocks:
                self._blocks[-1].sealed = True
            self._closed = True
            self._cond.notify_all()
        self._thread.join()
        if self._error is not None:
            raise self._error
        if self.failed is not None:
            raise SourceFailed(f"chunk {self.failed} does not match its signed sha256")

    def _next(self) -> tuple[_Block, int, int] | None:
        """The oldest block with chunks not yet taken and their span, recycling finished blocks; None once closed."""
        with self._cond:
            while True:
                while self._blocks and self._blocks[0].sealed and self._blocks[0].taken == self._blocks[0].filled:
                    self._free.append(self._blocks.popleft().view)
                    self._cond.notify_all()
                block = self._blocks[0] if self._blocks else None
                if block is not None and block.taken < block.filled:
                    taken, block.taken = block.taken, block.filled
                    return block, taken, block.filled
                if self._closed and not self._blocks:
                    return None
                self._cond.wait()

    def _run(self) -> None:
        while (item := self._next()) is not None:
            block, lo, hi = item
            if self.halted:
                continue  # drain: the reader stops at its next chunk
            try:
                bad = self.download.accept_run(block.first + lo // self.download.payload.chunk_size, block.view[lo:hi])
            except BaseException as exc:  # handed to the fetching thread by close()
                self._error = exc
            else:
                self.failed = bad


def _safe(url: str) -> str:
    """The URL without its query: a presigned URL's signature does not belong in logs."""
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
