"""Serves artifact chunks to devices: each requested chunk is published once for all who asked.

Devices ask on their own ``chunk-requests`` topic for the ranges they miss; requests that arrive
close together are merged, and every chunk is published once on the shared artifact topic, which
the broker fans out to every subscribed device. So the bytes sent per wave stay close to the
package size, whatever the number of devices.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from agent.errors import EdgeError
from agent.protocol import topics
from agent.protocol.chunks import from_ranges, read_chunk
from agent.protocol.messages import ChunkRequest
from agent.transport import MqttTransport

__all__ = ["ArtifactServer", "ServedArtifact"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServedArtifact:
    artifact_id: str
    payload: Path
    chunk_size: int
    chunk_count: int


class ArtifactServer:
    """Answers chunk requests for the artifacts it was given, from a sender thread."""

    def __init__(self, transport: MqttTransport, gather_s: float = 0.2, window: int = 64, resend_guard_s: float = 0.5) -> None:
        self.transport = transport
        self.gather_s = gather_s  # quiet time after the latest request before sending starts
        self.window = window  # chunks in flight before waiting for the broker's acks
        # A chunk published less than this long ago is not published again yet: a device that
        # asks for it again has usually just not processed it, and a resend goes to the whole wave.
        self.resend_guard_s = resend_guard_s
        self._artifacts: dict[str, ServedArtifact] = {}
        self._pending: dict[str, set[int]] = {}
        self._first_request: dict[str, float] = {}
        self._last_request: dict[str, float] = {}
        self._sent_at: dict[tuple[str, int], float] = {}
        self._cond = threading.Condition()
        self._stop = False
        self.bytes_sent = 0
        self.chunks_sent = 0
        self.requests = 0
        self._thread = threading.Thread(target=self._send_loop, name="artifact-server", daemon=True)

    def start(self) -> "ArtifactServer":
        self.transport.subscribe(topics.device("+", "chunk-requests"), 1)
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout=5)

    def serve(self, artifact: ServedArtifact) -> None:
        with self._cond:
            self._artifacts[artifact.artifact_id] = artifact

    def handle_request(self, raw: bytes) -> Optional[ChunkRequest]:
        """Queue the chunks a device asked for; malformed requests are dropped with a log line."""
        try:
            request = ChunkRequest.from_payload(raw)
        except EdgeError as exc:
            log.warning("ignored chunk request: %s", exc)
            return None
        with self._cond:
            artifact = self._artifacts.get(request.artifact_id)
            if artifact is None:
                return request
            self.requests += 1
            wanted = set(from_ranges(request.ranges, artifact.chunk_count))
            pending = self._pending.setdefault(request.artifact_id, set())
            now = time.monotonic()
            if not pending:
                self._first_request[request.artifact_id] = now
            self._last_request[request.artifact_id] = now
            pending |= wanted
            self._cond.notify_all()
        return request

    def _next_batch(self) -> Optional[tuple[ServedArtifact, list[int]]]:
        with self._cond:
            while not self._stop:
                now = time.monotonic()
                for artifact_id, pending in self._pending.items():
                    if pending and self._gathered(artifact_id, now):
                        ready = [i for i in sorted(pending) if now - self._sent_at.get((artifact_id, i), -1e9) >= self.resend_guard_s]
                        batch = ready[: self.window]
                        if batch:
                            pending.difference_update(batch)
                            return self._artifacts[artifact_id], batch
                self._cond.wait(self.gather_s / 3)
        return None

    def _gathered(self, artifact_id: str, now: float) -> bool:
        """Requests stopped arriving for a moment, or have been arriving for too long to wait more."""
        quiet = now - self._last_request[artifact_id] >= self.gather_s
        return quiet or now - self._first_request[artifact_id] >= 5 * self.gather_s

    def _send_loop(self) -> None:
        while (item := self._next_batch()) is not None:
            artifact, batch = item
            for n, index in enumerate(batch):
                data = read_chunk(artifact.payload, index, artifact.chunk_size)
                # Waiting for the ack of a window's last chunk keeps a slow link from being flooded.
                wait = 10.0 if n == len(batch) - 1 else None
                self.transport.publish(topics.artifact_chunk(artifact.artifact_id, index), data, qos=1, wait=wait)
                self._sent_at[(artifact.artifact_id, index)] = time.monotonic()
                self.bytes_sent += len(data)
                self.chunks_sent += 1
