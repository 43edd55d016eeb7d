"""ArtifactServer rounds and ChunkFetcher requests over a real broker: one publication per wave, repeats, resume."""

from __future__ import annotations

import hashlib
import os
import queue
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edgecore.delivery.download import Download
from edgecore.delivery.fetch import ChunkFetcher
from edgecore.errors import OperationFailed, ProtocolError
from edgecore.protocol import topics
from edgecore.protocol.manifest import PayloadInfo
from edgecore.protocol.reports import ChunkRequest
from edgecore.transport import Message, MqttTransport
from edgectl.artifacts.chunk_server import ArtifactServer, ServedArtifact
from tests.brokers import BrokerProcess
from tests.fleet import wait_for
from tests.pump import InboxPump

CHUNK = 4096
COUNT = 10
NEVER = 3600.0  # a gather, guard or timeout that no test waits out


@pytest.fixture
def artifact(tmp_path: Path) -> tuple[ServedArtifact, PayloadInfo]:
    data = os.urandom(CHUNK * COUNT - 100)  # the last chunk is short
    path = tmp_path / "payload.tar"
    path.write_bytes(data)
    pieces = [data[i:i + CHUNK] for i in range(0, len(data), CHUNK)]
    info = PayloadInfo(len(data), hashlib.sha256(data).hexdigest(), CHUNK, tuple(hashlib.sha256(p).hexdigest() for p in pieces))
    return ServedArtifact(info.sha256, path, CHUNK, len(pieces)), info


class Server:
    """The controller side: an ArtifactServer fed by a pump; ``serving`` False records requests without answering."""

    def __init__(self, url: str, **options: Any) -> None:
        self.inbox: queue.Queue[Message] = queue.Queue()
        self.transport = MqttTransport(url, f"srv-{uuid.uuid4().hex[:6]}", inbox=self.inbox)
        self.transport.connect()
        self.server = ArtifactServer(self.transport, **options).start()
        self.requests: list[ChunkRequest] = []
        self.serving = True
        self._pump = InboxPump(self.inbox, self._handle)

    def _handle(self, message: Message) -> None:
        request = ChunkRequest.from_payload(message.payload)
        self.requests.append(request)
        if self.serving:
            self.server.handle_request(request)

    def close(self) -> None:
        self._pump.close()
        self.server.stop()
        self.transport.close()


class Device:
    """A device's transport, message loop and ChunkFetcher, fetching in a thread of its own."""

    def __init__(self, url: str, device_id: str, request_interval_s: float = 5.0) -> None:
        self.inbox: queue.Queue[Message] = queue.Queue()
        self.transport = MqttTransport(url, f"dev-{device_id}-{uuid.uuid4().hex[:4]}", inbox=self.inbox)
        self.transport.connect()
        self.fetcher = ChunkFetcher(self.transport, device_id, request_interval_s, 60.0)
        self.error: list[BaseException] = []
        self._pump = InboxPump(self.inbox, lambda m: self.fetcher.feed(*topics.parse_artifact_chunk(m.topic), m.payload))

    def start_fetch(self, download: Download) -> threading.Thread:
        def run() -> None:
            try:
                self.fetcher.fetch(download)
            except BaseException as exc:  # reported by the test
                self.error.append(exc)
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        self.fetcher.cancel()
        self._pump.close()
        self.transport.close()


@pytest.fixture
def make(mosquitto: BrokerProcess) -> Iterator[dict[str, object]]:
    made: list[Server | Device] = []

    def server(**options: Any) -> Server:
        started = Server(mosquitto.url, **options)
        made.append(started)
        return started

    def device(device_id: str, **options: float) -> Device:
        joined = Device(mosquitto.url, device_id, **options)
        made.append(joined)
        return joined

    yield {"server": server, "device": device}
    for thing in reversed(made):
        thing.close()


def _request(device_id: str, artifact: ServedArtifact, ranges: list[list[int]], repeat: bool) -> ChunkRequest:
    return ChunkRequest(device_id, artifact.artifact_id, ranges, repeat)


def test_a_wave_gets_each_chunk_once_as_soon_as_every_expected_device_asked(
        make: dict[str, Any], artifact: tuple[ServedArtifact, PayloadInfo], tmp_path: Path) -> None:
    served, info = artifact
    # Without the expectation, a round would only start after a gather window no test waits out.
    srv = make["server"](gather_s=NEVER, expect_timeout_s=NEVER, resend_guard_s=NEVER)
    ids = ["d-1", "d-2", "d-3"]
    srv.server.serve(served, expect=ids)
    devices = [make["device"](d) for d in ids]
    downloads = [Download(tmp_path / d, info) for d in ids]
    threads = [dev.start_fetch(dl) for dev, dl in zip(devices, downloads, strict=False)]
    for thread in threads:
        thread.join(timeout=60)
    assert not any(dev.error for dev in devices), [dev.error for dev in devices]
    assert all(dl.done_path.read_bytes() == served.payload.read_bytes() for dl in downloads)
    assert srv.server.chunks_sent == COUNT and srv.server.bytes_sent == info.size
    assert sorted(r.device_id for r in srv.requests if not r.repeat) == ids


@pytest.mark.parametrize("guard, resent", [(NEVER, 0), (0.0, COUNT)])
def test_a_repeated_request_does_not_bring_back_chunks_still_in_flight(
        make: dict[str, Any], artifact: tuple[ServedArtifact, PayloadInfo], guard: float, resent: int) -> None:
    served, _ = artifact
    srv = make["server"](gather_s=0.05, resend_guard_s=guard)
    srv.server.serve(served)
    srv.server.handle_request(_request("d-1", served, [[0, COUNT]], repeat=False))
    wait_for(lambda: srv.server.chunks_sent == COUNT, 20, "the first round")
    srv.server.handle_request(_request("d-1", served, [[0, COUNT]], repeat=True))  # published moments ago
    srv.server.handle_request(_request("d-2", served, [[0, 1]], repeat=False))  # a newcomer: always answered
    wait_for(lambda: srv.server.chunks_sent >= COUNT + 1, 20, "the second round")
    wait_for(lambda: not srv.server._pending[served.artifact_id], 20, "the second round to finish")
    assert srv.server.chunks_sent == COUNT + max(1, resent)


@pytest.mark.parametrize("how", ["timeout", "release"])
def test_an_expected_device_that_never_asks_holds_the_round_back_only_so_long(
        make: dict[str, Any], artifact: tuple[ServedArtifact, PayloadInfo], how: str) -> None:
    served, _ = artifact
    srv = make["server"](gather_s=NEVER, expect_timeout_s=0.3 if how == "timeout" else NEVER)
    srv.server.serve(served, expect=["d-1", "already-has-it"])
    srv.server.handle_request(_request("d-1", served, [[0, COUNT]], repeat=False))
    if how == "release":
        srv.server.release(served.artifact_id, "already-has-it")  # it reported done without asking
    wait_for(lambda: srv.server.chunks_sent == COUNT, 20, "the round for the device that asked")


def test_requests_after_the_first_are_marked_as_repeats(
        make: dict[str, Any], artifact: tuple[ServedArtifact, PayloadInfo], tmp_path: Path) -> None:
    served, info = artifact
    srv = make["server"](gather_s=0.05)
    srv.server.serve(served)
    srv.serving = False
    device = make["device"]("d-1", request_interval_s=0.2)
    download = Download(tmp_path / "d-1", info)
    thread = device.start_fetch(download)
    wait_for(lambda: len(srv.requests) >= 3, 20, "three unanswered requests")
    srv.serving = True
    thread.join(timeout=60)
    assert not device.error and download.done_path.read_bytes() == served.payload.read_bytes()
    assert srv.requests[0].repeat is False and all(r.repeat for r in srv.requests[1:])


def test_a_download_resumes_from_its_part_file_and_counts_it_against_the_quota(
        artifact: tuple[ServedArtifact, PayloadInfo], tmp_path: Path) -> None:
    served, info = artifact
    data = served.payload.read_bytes()
    piece = [data[i * CHUNK:(i + 1) * CHUNK] for i in range(COUNT)]
    first = Download(tmp_path, info, quota_bytes=5 * CHUNK)
    assert all(first.accept(i, piece[i]) for i in (0, 3, 7))
    assert not first.accept(3, piece[3]) and not first.accept(4, piece[5])  # duplicate; wrong bytes
    # No close(): as after a crash, the .part file alone tells the next run what landed.
    again = Download(tmp_path, info, quota_bytes=5 * CHUNK)
    first.close()
    assert again.have == {0, 3, 7} and again.have_bytes == 3 * CHUNK and again.rejected == 0
    assert again.accept(1, piece[1]) and again.accept(2, piece[2])
    with pytest.raises(OperationFailed, match="disk full"):
        again.accept(4, piece[4])
    assert not again.part.exists()
    resumed = Download(tmp_path, info)
    for i in range(COUNT):
        resumed.accept(i, piece[i])
    assert resumed.complete and resumed.finish().read_bytes() == data


def test_chunk_request_repeat_is_optional_and_checked() -> None:
    old = b'{"schema": 1, "device_id": "d", "artifact_id": "a1", "ranges": [[0, 2]]}'
    assert ChunkRequest.from_payload(old) == ChunkRequest("d", "a1", [[0, 2]], False)
    assert ChunkRequest.from_payload(ChunkRequest("d", "a1", [[1, 2]], True).to_payload()).repeat is True
    with pytest.raises(ProtocolError, match="repeat"):
        ChunkRequest.from_payload(b'{"schema": 1, "device_id": "d", "artifact_id": "a1", "ranges": [], "repeat": 1}')
