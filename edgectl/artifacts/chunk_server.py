"""Serves artifact chunks to devices: each requested chunk is published once for all who asked.

Devices ask on their own ``chunk-requests`` topic for the ranges they miss. Requests are gathered
into rounds: a round starts once every device the server was told to expect has asked (at once for
a single device), or, without such a list, once requests stop arriving for a moment. Each chunk of
a round is published once on the shared artifact topic, which the broker fans out to every
subscribed device, so the bytes sent per wave stay close to the package size, whatever the number
of devices. A repeated request (a device that heard nothing new for a while) does not bring back
chunks published moments before it: those are still on their way to the device and to the wave.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from edgecore.protocol import topics
from edgecore.protocol.chunks import from_ranges
from edgecore.protocol.reports import ChunkRequest
from edgecore.transport import Transport

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

    def __init__(self, transport: Transport, gather_s: float = 0.2, window: int = 64, resend_guard_s: float = 0.5,
                 expect_timeout_s: float = 3.0) -> None:
        self.transport = transport
        self.gather_s = gather_s  # without expected devices: quiet time after the latest request before a round
        self.window = window  # chunks taken per batch; about this many await the broker's ack at once (bounds memory)
        # A repeated request does not bring back a chunk published less than this long ago: the device
        # has usually just not processed it yet, and a resend would go to the whole wave.
        self.resend_guard_s = resend_guard_s
        self.expect_timeout_s = expect_timeout_s  # longest wait for expected devices that have not asked yet
        self._artifacts: dict[str, ServedArtifact] = {}
        self._pending: dict[str, set[int]] = {}
        self._cursor: dict[str, int] = {}  # rounds go through the chunks in index order, from here
        self._waiting: dict[str, set[str]] = {}  # expected devices that have not asked yet
        self._round_start: dict[str, float] = {}
        self._last_request: dict[str, float] = {}
        self._sending: set[str] = set()
        self._sent_at: dict[str, list[float]] = {}
        self._cond = threading.Condition()
        self._stop = False
        self.bytes_sent = 0
        self.chunks_sent = 0
        self.requests = 0
        self.first_sent_at: float | None = None  # time.monotonic() of the first chunk published
        self._thread = threading.Thread(target=self._send_loop, name="artifact-server", daemon=True)

    def start(self) -> ArtifactServer:
        self.transport.subscribe(topics.device("+", "chunk-requests"), 1)
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout=5)

    def serve(self, artifact: ServedArtifact, expect: Iterable[str] = ()) -> None:
        """Answer requests for ``artifact``; ``expect``: the devices about to ask for it (see ``expect``)."""
        with self._cond:
            self._artifacts[artifact.artifact_id] = artifact
            self._sent_at.setdefault(artifact.artifact_id, [float("-inf")] * artifact.chunk_count)
        self.expect(artifact.artifact_id, expect)

    def expect(self, artifact_id: str, device_ids: Iterable[str]) -> None:
        """The next round for ``artifact_id`` starts once these devices have asked, or after ``expect_timeout_s``.

        Call it before publishing their desired states: then no device of a wave joins a round late
        (which would cost a second publication of the chunks it missed)."""
        with self._cond:
            if device_ids := set(device_ids):
                self._waiting.setdefault(artifact_id, set()).update(device_ids)
                self._cond.notify_all()

    def release(self, artifact_id: str, device_id: str) -> None:
        """``device_id`` will not ask after all (it already has the artifact, or refused it): stop waiting for it."""
        with self._cond:
            self._waiting.get(artifact_id, set()).discard(device_id)
            self._cond.notify_all()

    def handle_request(self, request: ChunkRequest) -> None:
        """Queue the chunks a device asked for (read with :func:`edgecore.protocol.reports.read_report`, which
        checks that the device asking is the one its topic names); an artifact not served here is ignored."""
        with self._cond:
            artifact = self._artifacts.get(request.artifact_id)
            if artifact is None:
                return
            self.requests += 1
            self._queue(artifact, request, time.monotonic())
            self._cond.notify_all()

    def _queue(self, artifact: ServedArtifact, request: ChunkRequest, now: float) -> None:
        artifact_id = artifact.artifact_id
        wanted = set(from_ranges(request.ranges, artifact.chunk_count))
        if request.repeat:
            sent_at = self._sent_at[artifact_id]
            wanted = {i for i in wanted if now - sent_at[i] >= self.resend_guard_s}
        self._waiting.get(artifact_id, set()).discard(request.device_id)
        pending = self._pending.setdefault(artifact_id, set())
        if not pending and artifact_id not in self._sending:
            self._round_start[artifact_id] = now
        self._last_request[artifact_id] = now
        pending |= wanted

    def _next_batch(self) -> tuple[ServedArtifact, list[int]] | None:
        with self._cond:
            while not self._stop:
                now = time.monotonic()
                wake = now + 1.0
                for artifact_id, pending in self._pending.items():
                    if not pending:
                        self._sending.discard(artifact_id)
                        continue
                    opens = self._round_opens(artifact_id)
                    if opens <= now:
                        self._open_round(artifact_id)
                        return self._artifacts[artifact_id], self._take(artifact_id, pending, now)
                    wake = min(wake, opens)
                self._cond.wait(wake - now)
        return None

    def _round_opens(self, artifact_id: str) -> float:
        """When chunks pending for ``artifact_id`` may go: a running round goes on; a new one waits as documented."""
        if artifact_id in self._sending:
            return float("-inf")
        start = self._round_start[artifact_id]
        waiting = self._waiting.get(artifact_id)
        if waiting is not None:
            return start + self.expect_timeout_s if waiting else float("-inf")
        return min(self._last_request[artifact_id] + self.gather_s, start + 5 * self.gather_s)

    def _open_round(self, artifact_id: str) -> None:
        if waiting := self._waiting.pop(artifact_id, None):  # still missing: they join later rounds like any late device
            log.info("artifact %s: %d expected device(s) did not ask within %.1fs; sending to the others",
                     artifact_id[:12], len(waiting), self.expect_timeout_s)
        self._sending.add(artifact_id)

    def _take(self, artifact_id: str, pending: set[int], now: float) -> list[int]:
        """Up to ``window`` pending chunks in index order from the round's cursor, wrapping around."""
        count = self._artifacts[artifact_id].chunk_count
        cursor = self._cursor.get(artifact_id, 0)
        batch: list[int] = []
        for index in itertools.chain(range(cursor, count), range(cursor)):
            if index in pending:
                batch.append(index)
                if len(batch) == self.window:
                    break
        pending.difference_update(batch)
        self._cursor[artifact_id] = (batch[-1] + 1) % count
        sent_at = self._sent_at[artifact_id]
        for index in batch:  # from now on it is on its way: a repeated request does not bring it back
            sent_at[index] = now
        return batch

    def _send_loop(self) -> None:
        acks = _AckWindow(self.transport, self.window)
        try:
            while (item := self._next_batch()) is not None:
                artifact, batch = item
                try:
                    with artifact.payload.open("rb", buffering=0) as f:
                        self._publish(artifact, batch, f.fileno(), acks)
                except OSError as exc:
                    log.error("cannot read artifact %s: %s", artifact.payload, exc)
        finally:
            acks.close()

    def _publish(self, artifact: ServedArtifact, batch: list[int], fd: int, acks: _AckWindow) -> None:
        if self.first_sent_at is None:
            self.first_sent_at = time.monotonic()
        for index in batch:
            data = os.pread(fd, artifact.chunk_size, index * artifact.chunk_size)
            acks.publish(topics.artifact_chunk(artifact.artifact_id, index), data)
            self.bytes_sent += len(data)
            self.chunks_sent += 1


class _AckWindow:
    """Publishes chunks with at most ``1.5 * window`` of them not yet acknowledged by the broker, never draining.

    Every ``window // 2``-th chunk is published by a helper thread that waits for its ack while the
    sender goes on; the sender blocks only while two such waits are pending. Acks of one connection
    come back in order, so an acked marker stands for every chunk published before it. Waiting for
    the last chunk of each window instead would empty the pipe every time, and a pipe that runs dry
    costs a delayed TCP ack (40 ms on Linux) at each stop."""

    def __init__(self, transport: Transport, window: int) -> None:
        self.transport = transport
        self.step = max(1, window // 2)
        self._count = 0
        self._slots = threading.Semaphore(2)
        self._markers: queue.SimpleQueue[tuple[str, bytes] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._wait_loop, name="artifact-server-acks", daemon=True)
        self._thread.start()

    def publish(self, topic: str, data: bytes) -> None:
        self._count += 1
        if self._count % self.step:
            self.transport.publish(topic, data, qos=1)
            return
        while not self._slots.acquire(timeout=30):  # each wait ends within 10 s: this is a stuck helper
            log.warning("artifact server: no broker ack for 30 s, still waiting before publishing more chunks")
        self._markers.put((topic, data))

    def _wait_loop(self) -> None:
        while (marker := self._markers.get()) is not None:
            if not self.transport.publish(marker[0], marker[1], qos=1, wait=10.0):
                log.info("chunk %s not acknowledged within 10s; devices ask again for what they miss", marker[0])
            self._slots.release()

    def close(self) -> None:
        self._markers.put(None)
        self._thread.join(timeout=15)
