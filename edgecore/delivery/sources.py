"""Where an artifact's chunks come from: the desired state's HTTP(S) URLs first, then MQTT.

:class:`ArtifactFetcher` is the one fetch the deployment steps call. It tries the URLs the signed
desired state named for this payload (:mod:`edgecore.delivery.http_fetch`), then asks over MQTT
(:class:`ChunkFetcher`) for whatever is still missing, and tells ``on_fallback`` why (the event the
device publishes). One deadline, the chunk fetcher's ``deadline_s`` (``deploy.download_deadline_s``),
bounds both: HTTP gets what is left of it, MQTT what HTTP left. The URLs are kept in
``<state>/artifact-urls.json`` when the desired state is accepted, so a deployment resumed after a
restart fetches from them again; the ``.part`` file says which chunks are already there.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from edgecore.delivery.download import Download
from edgecore.delivery.fetch import ChunkFetcher
from edgecore.delivery.http_fetch import HttpFetch, HttpSettings
from edgecore.durable import atomic_write_json, read_json
from edgecore.errors import OperationFailed

__all__ = ["ArtifactFetcher", "ArtifactUrls"]

log = logging.getLogger(__name__)

URLS_SCHEMA = 1
KEEP = 8  # artifacts whose URLs are remembered: the queued and running deployments, with room to spare


class ArtifactUrls:
    """The URLs each artifact (payload sha256) may be fetched from, as the newest desired state named them."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def _read(self) -> dict[str, list[str]]:
        raw = read_json(self.path)
        if not isinstance(raw, dict) or raw.get("schema") != URLS_SCHEMA or not isinstance(raw.get("artifacts"), dict):
            return {}
        return {k: [u for u in v if isinstance(u, str)] for k, v in raw["artifacts"].items() if isinstance(v, list)}

    def remember(self, artifact_id: str, urls: Sequence[str]) -> None:
        """Record (or, with no URLs, forget) where ``artifact_id`` may be fetched; a failed save only costs HTTP."""
        with self._lock:
            known = self._read()
            if not urls and artifact_id not in known:
                return
            known.pop(artifact_id, None)  # re-inserted last: the newest stay when old ones are dropped
            if urls:
                known[artifact_id] = list(urls)
            kept = dict(list(known.items())[-KEEP:])
            try:
                atomic_write_json(self.path, {"schema": URLS_SCHEMA, "artifacts": kept})
            except OSError as exc:
                log.warning("cannot save the artifact URLs (%s): this download uses MQTT only", exc.strerror or exc)

    def urls(self, artifact_id: str) -> list[str]:
        with self._lock:
            return self._read().get(artifact_id, [])


class ArtifactFetcher:
    """HTTP(S) from the remembered URLs, then MQTT chunks for the rest; ``feed``/``heard`` are the MQTT side's.

    ``on_fallback(artifact_id, why)`` is called when HTTP could not complete a download and MQTT takes over."""

    def __init__(self, chunks: ChunkFetcher, state_dir: Path, settings: HttpSettings,
                 on_fallback: Callable[[str, str], None] | None = None) -> None:
        self.chunks = chunks
        self.on_fallback = on_fallback
        self.known = ArtifactUrls(state_dir / "artifact-urls.json")
        self.http = HttpFetch(settings)
        self._cancelled = threading.Event()
        self._running: str | None = None  # the artifact being fetched now
        self._lock = threading.Lock()

    def remember(self, artifact_id: str, urls: Sequence[str]) -> None:
        self.known.remember(artifact_id, urls)

    def feed(self, artifact_id: str, index: int, data: bytes) -> None:
        self.chunks.feed(artifact_id, index, data)

    def heard(self, artifact_id: str, index: int) -> None:
        self.chunks.heard(artifact_id, index)

    def cancel(self, artifact_id: str | None = None) -> None:
        """Stop the running fetch (the agent stops), or only a fetch of ``artifact_id`` (a newer desired state)."""
        with self._lock:
            if artifact_id is None or artifact_id == self._running:
                self._cancelled.set()
                self.http.cancel()
        if artifact_id is None:
            self.chunks.cancel()
        else:
            self.chunks.cancel(artifact_id)

    def fetch(self, download: Download) -> None:
        """Block until every chunk of ``download`` is on disk; raise OperationFailed otherwise."""
        with self._lock:
            self._running = download.payload.sha256
            self._cancelled.clear()
            self.http.stop.clear()
        try:
            self._fetch(download)
        finally:
            with self._lock:
                self._running = None

    def _fetch(self, download: Download) -> None:
        deadline = time.monotonic() + self.chunks.deadline_s
        urls = self.known.urls(download.payload.sha256)
        if urls and not download.complete:
            if self.http.fetch(download, urls, deadline):
                download.finish()
                return
            if not self._cancelled.is_set():
                self._fell_back(download, len(urls))
        if self._cancelled.is_set():
            download.close()
            raise OperationFailed("download cancelled: superseded by a newer desired state or agent stop")
        self.chunks.fetch(download, deadline)

    def _fell_back(self, download: Download, urls: int) -> None:
        missing = len(download.payload.chunks) - len(download.have)
        why = (f"HTTP left {missing} of {len(download.payload.chunks)} chunk(s) after {urls} URL(s) "
               f"({'; '.join(self.http.failures) or 'no reason given'}); asking over MQTT")
        log.warning("artifact %s: %s", download.payload.sha256[:12], why)
        if self.on_fallback is not None:
            self.on_fallback(download.payload.sha256, why[:1000])
