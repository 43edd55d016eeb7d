"""Fetching an artifact's chunks over MQTT: ask for what is missing, take what arrives.

Chunks arrive on the shared artifact topic that the broker fans out to every device of a wave;
this device asks (on its own chunk-requests topic) only for the ranges it misses, again whenever
no new chunk arrived for a while, so restarts, reconnects and long offline periods all resume.
Requests after the first are marked as repeats: the server then does not resend what it published
moments before, which is still on its way here.
"""

from __future__ import annotations

import logging
import random
import threading
import time

from edgecore.delivery.download import Download
from edgecore.errors import EdgeError, OperationFailed
from edgecore.protocol import topics
from edgecore.protocol.reports import ChunkRequest
from edgecore.transport import Transport

__all__ = ["ChunkFetcher"]

log = logging.getLogger(__name__)

MAX_RANGES_PER_REQUEST = 512


class ChunkFetcher:
    """Feeds chunks from the message loop into the current download; the worker waits in fetch()."""

    def __init__(self, transport: Transport, device_id: str, request_interval_s: float, deadline_s: float) -> None:
        self.transport = transport
        self.device_id = device_id
        self.request_interval_s = request_interval_s
        self.deadline_s = deadline_s
        self._cond = threading.Condition()
        self._download: Download | None = None
        self._error: EdgeError | None = None
        self._cancelled = False
        self._progress_at = 0.0  # time.monotonic() of the latest request, or of a chunk the download lacked

    def feed(self, artifact_id: str, index: int, data: bytes) -> None:
        """Called by the message loop for every chunk; late, foreign and duplicate chunks are dropped."""
        with self._cond:
            download = self._download
            if download is None or download.payload.sha256 != artifact_id:
                return
            try:
                rejected = download.rejected
                if download.accept(index, data):
                    self._progress_at = time.monotonic()
                    if download.complete:  # the waiting worker only needs waking to finish
                        self._cond.notify_all()
                elif download.rejected > rejected:
                    log.warning("dropped chunk %d of artifact %s: %d bytes, hash or size does not match the signed"
                                " manifest; it will be asked for again", index, artifact_id[:12], len(data))
            except EdgeError as exc:
                self._error = self._error or exc  # the first failure is the cause; later ones follow from it
                self._cond.notify_all()

    def heard(self, artifact_id: str, index: int) -> None:
        """Called as a chunk reaches this device, before it is processed: one still queued here is not missing.

        Only chunks this download still lacks count, so a stream of chunks other devices asked for
        does not hold back a request for one this device lost. Lock-free: it only moves a timestamp."""
        download = self._download
        if download is not None and download.payload.sha256 == artifact_id and index not in download.have:
            self._progress_at = time.monotonic()

    def cancel(self, artifact_id: str | None = None) -> None:
        """Stop the running fetch (the agent stops), or only a fetch of ``artifact_id`` (a newer desired state arrived)."""
        with self._cond:
            if artifact_id is not None and (self._download is None or self._download.payload.sha256 != artifact_id):
                return  # that download already ended: never cancel the one that came after it
            self._cancelled = True
            self._cond.notify_all()

    def fetch(self, download: Download, deadline: float | None = None) -> None:
        """Block until every chunk of ``download`` is on disk; raise OperationFailed otherwise (also once
        ``deadline``, a ``time.monotonic()`` time, passes: by default ``deadline_s`` from now)."""
        topic = topics.artifact_chunks_filter(download.payload.sha256)
        with self._cond:
            self._download, self._error, self._cancelled = download, None, False
        self.transport.subscribe(topic, 1)
        complete = False
        try:
            self._wait(download, time.monotonic() + self.deadline_s if deadline is None else deadline)
            complete = True
        finally:
            self.transport.unsubscribe(topic)
            with self._cond:
                self._download = None
            if not complete:
                download.close()
        download.finish()

    def _wait(self, download: Download, deadline: float) -> None:
        stalls = 0  # requests in a row that brought nothing: back off, so a wave is not flooded
        repeat = False
        while True:
            with self._cond:
                self._raise_if_stopped(download)
                if download.complete:
                    return
                missing = download.missing()
            if time.monotonic() > deadline:
                download.discard()
                raise OperationFailed(f"download did not complete within {self.deadline_s:.0f}s"
                                      f" ({download.rejected} chunk(s) dropped: hash or size not as signed)")
            before = len(download.have)
            repeat = self._request(download, missing, repeat) or repeat
            interval = self.request_interval_s * min(2**stalls, 4) * random.uniform(0.8, 1.2)
            self._wait_for_progress(download, interval)
            stalls = stalls + 1 if len(download.have) == before else 0

    def _raise_if_stopped(self, download: Download) -> None:
        if self._error is not None:
            raise self._error
        if self._cancelled:
            raise OperationFailed("download cancelled: superseded by a newer desired state or agent stop")

    def _request(self, download: Download, missing: list[list[int]], repeat: bool) -> bool:
        """Ask for ``missing``; True if the request was handed to the broker connection."""
        if not self.transport.connected:
            return False
        request = ChunkRequest(self.device_id, download.payload.sha256, missing[:MAX_RANGES_PER_REQUEST], repeat)
        return self.transport.publish(topics.device(self.device_id, "chunk-requests"), request.to_payload(), qos=1)

    def _wait_for_progress(self, download: Download, interval: float) -> None:
        """Return once no chunk arrived for ``interval`` seconds (then ask again) or when done."""
        with self._cond:
            self._progress_at = time.monotonic()
            while not download.complete and self._error is None and not self._cancelled:
                quiet_for = time.monotonic() - self._progress_at
                if quiet_for >= interval:
                    return
                self._cond.wait(interval - quiet_for)
