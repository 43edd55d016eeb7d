"""Chunks taken in blocks: a run of consecutive chunks checked one by one, HTTP bodies read in blocks of whole
chunks, and the payload flushed to disk in the background while it fills.

What must hold whatever the block: every chunk is checked against its signed sha256 and only chunks
before a bad one are kept; a body cut inside a block keeps the whole chunks before the cut; a
write-back error that the background flush meets fails the download instead of being lost; the
flush leaks no descriptor and works in a forked child too.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import multiprocessing
import os
import re
import resource
import socket
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from edgecore.delivery.download import FLUSH_BYTES, FLUSHER, Download
from edgecore.delivery.http_fetch import BLOCK_BYTES, WRITE_AHEAD, HttpFetch, HttpSettings
from edgecore.errors import OperationFailed
from edgecore.protocol.manifest import PayloadInfo
from edgectl.artifacts import RangeServer
from tests.adversarial.hostile import HostileOrigin
from tests.fleet import wait_for


def info(data: bytes, chunk: int) -> PayloadInfo:
    pieces = [data[i:i + chunk] for i in range(0, len(data), chunk)]
    return PayloadInfo(len(data), hashlib.sha256(data).hexdigest(), chunk, tuple(hashlib.sha256(p).hexdigest() for p in pieces))


SMALL = b"".join(hashlib.sha256(bytes([i])).digest() for i in range(80))  # 2560 bytes: chunks of 1024, 1024 and 512
CHUNK = 64 * 1024
BIG = os.urandom(3 * BLOCK_BYTES + 5 * CHUNK + 123)  # 54 chunks, the last short: four blocks of up to 16
BAD = BLOCK_BYTES // CHUNK + 4  # a chunk in the second block


def plenty(_path: Path) -> int:
    return 10**12


def damaged(data: bytes, index: int, chunk: int) -> bytes:
    at = index * chunk + 7
    return data[:at] + bytes([data[at] ^ 1]) + data[at + 1:]


@pytest.mark.parametrize(("first", "data", "held", "returned", "have"), [
    (0, SMALL, set(), None, {0, 1, 2}),
    (1, SMALL[1024:], set(), None, {1, 2}),
    (0, SMALL, {1}, None, {0, 1, 2}),  # a chunk already here is skipped, not counted against the source
    (0, damaged(SMALL, 1, 1024), set(), 1, {0}),  # chunk 2 is good but after the bad one: not looked at
    (0, SMALL[:1500], set(), 1, {0}),  # data that ends inside a chunk
    (2, SMALL[2048:] + b"\0", set(), 3, {2}),  # more than the payload holds
    (3, b"\0", set(), 3, set()),
    (-1, SMALL, set(), -1, set()),
])
def test_a_run_of_chunks_is_checked_chunk_by_chunk(tmp_path: Path, first: int, data: bytes, held: set[int],
                                                    returned: int | None, have: set[int]) -> None:
    download = Download(tmp_path, info(SMALL, 1024), free_bytes=plenty)
    for index in held:
        assert download.accept(index, SMALL[index * 1024:(index + 1) * 1024])
    assert download.accept_run(first, data) == returned
    assert download.have == have and download.rejected == (0 if returned is None else 1)
    assert download.have_bytes == sum(map(download.chunk_length, have))
    on_disk = download.part.read_bytes()
    for index in have:
        assert on_disk[index * 1024:(index + 1) * 1024] == SMALL[index * 1024:(index + 1) * 1024]


def test_a_last_chunk_of_one_byte_is_taken_and_only_at_its_index(tmp_path: Path) -> None:
    data = SMALL[:2049]
    download = Download(tmp_path, info(data, 1024), free_bytes=plenty)
    assert download.accept_run(-1, data[2048:]) == -1 and download.rejected == 1  # the last chunk's bytes, at -1
    assert download.accept_run(0, data) is None and download.complete


def test_nothing_past_a_payload_of_whole_chunks_is_taken(tmp_path: Path) -> None:
    data = SMALL[:2048]  # two whole chunks: "chunk 2" would be 0 bytes long
    download = Download(tmp_path, info(data, 1024), free_bytes=plenty)
    assert download.accept_run(1, data[1024:] + b"\0") == 2 and download.have == {1} and download.rejected == 1


def test_a_run_past_the_quota_is_a_full_disk(tmp_path: Path) -> None:
    download = Download(tmp_path, info(SMALL, 1024), free_bytes=plenty, quota_bytes=2048)
    with pytest.raises(OperationFailed, match="disk full while downloading"):
        download.accept_run(0, SMALL)
    assert not download.part.exists()


def test_a_finished_download_takes_no_run(tmp_path: Path) -> None:
    download = Download(tmp_path, info(SMALL, 1024), free_bytes=plenty)
    assert download.accept_run(0, SMALL) is None
    download.finish()
    assert download.accept_run(0, damaged(SMALL, 0, 1024)) is None and download.rejected == 0


def _open_on(directory: Path) -> list[str]:
    """What this process's open descriptors point to inside ``directory``."""
    targets = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile (the listing's own descriptor)
            continue
        if target.startswith(str(directory)):
            targets.append(target)
    return targets


def test_the_background_flush_leaks_no_descriptor_and_the_payload_is_whole(tmp_path: Path) -> None:
    data = os.urandom(2 * FLUSH_BYTES + 3 * CHUNK)
    download = Download(tmp_path, info(data, CHUNK), free_bytes=plenty)
    for offset in range(0, len(data), BLOCK_BYTES):
        assert download.accept_run(offset // CHUNK, data[offset:offset + BLOCK_BYTES]) is None
    assert len(_open_on(tmp_path)) >= 1  # the .part file, open while the download runs
    assert download.flushed.wait(30)
    assert download.finish().read_bytes() == data and download.flush_error is None
    assert _open_on(tmp_path) == []


def test_a_flush_is_asked_for_once_every_flush_bytes_written(tmp_path: Path) -> None:
    assert FLUSH_BYTES == 4 * 1024 * 1024  # a few writes' worth: the final fsync waits for little, few syncs are asked
    data = os.urandom(2 * FLUSH_BYTES - 1)  # two chunks: FLUSH_BYTES, then one byte less
    download = Download(tmp_path / "a", info(data, FLUSH_BYTES), free_bytes=plenty)
    assert download.accept(0, data[:FLUSH_BYTES]) and download.flushes == 1
    assert download.flushed.wait(30)
    assert download.accept(1, data[FLUSH_BYTES:]) and download.flushes == 1  # counted from the last flush
    assert download.finish().read_bytes() == data
    data = os.urandom(FLUSH_BYTES + 1)  # one byte short of FLUSH_BYTES, then two bytes
    download = Download(tmp_path / "b", info(data, FLUSH_BYTES - 1), free_bytes=plenty)
    assert download.accept(0, data[:FLUSH_BYTES - 1]) and download.flushes == 0
    assert download.accept(1, data[FLUSH_BYTES - 1:]) and download.flushes == 1
    assert download.finish().read_bytes() == data
    assert [t.name for t in threading.enumerate()].count("download-flusher") == 1  # one for the process


def test_a_flush_that_cannot_get_a_descriptor_is_left_to_the_final_fsync(tmp_path: Path) -> None:
    download = Download(tmp_path, info(SMALL, 1024), free_bytes=plenty)
    assert download.accept(0, SMALL[:1024])
    fd = os.open(download.part, os.O_RDONLY)
    lowest = os.dup(fd)  # the descriptor the flusher's dup would get
    os.close(lowest)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowest, hard))  # ... is past the limit now: EMFILE
    try:
        FLUSHER.submit(download, fd)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        os.close(fd)
    assert download.flushed.is_set() and download.flush_error is None
    assert download.accept_run(1, SMALL[1024:]) is None and download.finish().read_bytes() == SMALL


def test_a_write_back_error_the_flush_met_fails_the_download(tmp_path: Path) -> None:
    """fdatasync of a pipe fails (EINVAL) as a write-back error would: the flusher hands it to the download."""
    download = Download(tmp_path, info(SMALL, 1024), free_bytes=plenty)
    assert download.accept(0, SMALL[:1024])
    read_end, write_end = os.pipe()
    try:
        FLUSHER.submit(download, read_end)
        assert download.flushed.wait(10)
    finally:
        os.close(read_end)
        os.close(write_end)
    assert download.flush_error is not None and download.flush_error.errno == errno.EINVAL
    with pytest.raises(OperationFailed, match=r"cannot write download .*: Invalid argument"):
        download.accept(1, SMALL[1024:2048])
    assert not download.part.exists()  # not durable: removed, as a failed write is


class Gated(Download):
    """A download whose background flush waits at ``where`` ("begin" or "end") until ``gate`` opens; ``reached``
    is set when it got there, ``began`` records whether each job went on to sync."""

    def __init__(self, *args: Any, where: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.where, self.gate, self.reached = where, threading.Event(), threading.Event()
        self.began: list[bool] = []

    def begin_flush(self) -> bool:
        if self.where == "begin":
            self.reached.set()
            assert self.gate.wait(30)
        self.began.append(super().begin_flush())
        return self.began[-1]

    def end_flush(self, error: OSError | None) -> None:
        if self.where == "end":
            self.reached.set()
            assert self.gate.wait(30)
        super().end_flush(error)


def _finish_in_thread(download: Download) -> tuple[threading.Thread, list[BaseException | Path]]:
    outcome: list[BaseException | Path] = []

    def finish() -> None:
        try:
            outcome.append(download.finish())
        except OperationFailed as exc:
            outcome.append(exc)

    thread = threading.Thread(target=finish)
    thread.start()
    return thread, outcome


def test_a_download_finishing_does_not_wait_for_flushes_queued_before_its_own(tmp_path: Path) -> None:
    data = os.urandom(FLUSH_BYTES)
    first = Gated(tmp_path / "a", info(data, CHUNK), free_bytes=plenty, where="begin")
    assert first.accept_run(0, data) is None and first.flushes == 1 and first.reached.wait(10)  # the flusher waits
    second = Gated(tmp_path / "b", info(data, CHUNK), free_bytes=plenty, where="nowhere")
    assert second.accept_run(0, data) is None and second.flushes == 1  # queued behind it
    finishing, outcome = _finish_in_thread(second)
    finishing.join(10)
    first.gate.set()
    assert not finishing.is_alive() and outcome == [second.done_path]
    assert second.flushed.wait(10) and second.began == [False] and second.flush_error is None  # its job was dropped
    assert first.flushed.wait(10) and first.finish().read_bytes() == data


def test_finish_waits_for_a_running_flush_and_raises_what_it_met(tmp_path: Path) -> None:
    download = Gated(tmp_path, info(SMALL, 1024), free_bytes=plenty, where="end")
    assert download.accept_run(0, SMALL) is None
    read_end, write_end = os.pipe()
    try:
        FLUSHER.submit(download, read_end)  # its fdatasync fails (EINVAL); the job then waits to end
        assert download.reached.wait(10)  # the fdatasync ran; the job has not ended
        finishing, outcome = _finish_in_thread(download)
        finishing.join(0.5)
        assert finishing.is_alive()  # waiting for the running flush
        download.gate.set()
        finishing.join(10)
    finally:
        download.gate.set()
        os.close(read_end)
        os.close(write_end)
    assert len(outcome) == 1 and isinstance(outcome[0], OperationFailed) and "Invalid argument" in str(outcome[0])
    assert not download.part.exists() and not download.done_path.exists()


def test_a_write_back_error_is_raised_by_finish(tmp_path: Path) -> None:
    download = Download(tmp_path, info(SMALL, 1024), free_bytes=plenty)
    assert download.accept_run(0, SMALL) is None
    download.flush_error = OSError(errno.EIO, "Input/output error")  # as the flusher records one
    with pytest.raises(OperationFailed, match=r"cannot write download .*: Input/output error"):
        download.finish()
    assert not download.part.exists() and not download.done_path.exists()


def _fill_in_child(directory: str, data: bytes) -> None:
    download = Download(Path(directory), info(data, CHUNK), free_bytes=plenty)
    for offset in range(0, len(data), BLOCK_BYTES):
        download.accept_run(offset // CHUNK, data[offset:offset + BLOCK_BYTES])
    download.finish()


def test_a_forked_child_flushes_with_its_own_thread(tmp_path: Path) -> None:
    data = os.urandom(FLUSH_BYTES + CHUNK)
    _fill_in_child(str(tmp_path / "parent"), data)  # the parent's flusher thread runs now; a child does not inherit it
    child = multiprocessing.get_context("fork").Process(target=_fill_in_child, args=(str(tmp_path / "child"), data))
    child.start()
    child.join(60)
    if child.is_alive():
        child.kill()
    assert child.exitcode == 0
    assert (tmp_path / "child" / f"{info(data, CHUNK).sha256}.payload").read_bytes() == data


class Origin:
    """Serves BIG by Range with ``body(lo, hi)`` as the body and an honest head; counts the requests."""

    def __init__(self, body: Callable[[int, int], bytes]) -> None:
        self.asked: list[str] = []
        origin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                origin.asked.append(self.headers.get("Range", ""))
                match = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
                lo, hi = (int(match[1]), int(match[2])) if match else (0, len(BIG) - 1)
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {lo}-{hi}/{len(BIG)}")
                self.send_header("Content-Length", str(hi - lo + 1))
                self.end_headers()
                with contextlib.suppress(OSError):  # a fetch that gave the source up closes before the end
                    self.wfile.write(body(lo, hi))
                self.close_connection = True

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/a"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def origin() -> Iterator[Callable[[Callable[[int, int], bytes]], Origin]]:
    started: list[Origin] = []

    def start(body: Callable[[int, int], bytes]) -> Origin:
        started.append(Origin(body))
        return started[-1]

    yield start
    for one in started:
        one.server.shutdown()
        one.server.server_close()


def _fetch(tmp_path: Path, url: str, settings: HttpSettings = HttpSettings(timeout_s=5)) -> tuple[bool, Download, HttpFetch]:
    download = Download(tmp_path / "dl", info(BIG, CHUNK), free_bytes=plenty)
    fetch = HttpFetch(settings)
    done = fetch.fetch(download, [url])
    download.close()
    return done, download, fetch


@pytest.mark.parametrize("rate", [None, 40 * 1024 * 1024])  # uncapped: whole chunks read; capped: paced pieces
def test_a_payload_of_several_blocks_arrives_whole_in_one_request(tmp_path: Path, rate: int | None) -> None:
    root = tmp_path / "served"
    root.mkdir()
    (root / "payload").write_bytes(BIG)
    server = RangeServer(root).start()
    try:
        done, download, fetch = _fetch(tmp_path, server.url_of("payload"), HttpSettings(timeout_s=5, max_bytes_per_s=rate))
    finally:
        server.stop()
    assert done and server.requests == 1 and fetch.bytes_received == len(BIG)
    assert download.finish().read_bytes() == BIG


def test_a_bad_chunk_in_a_later_block_keeps_exactly_the_chunks_before_it(
        tmp_path: Path, origin: Callable[[Callable[[int, int], bytes]], Origin]) -> None:
    bad = damaged(BIG, BAD, CHUNK)
    served = origin(lambda lo, hi: bad[lo:hi + 1])
    done, download, fetch = _fetch(tmp_path, served.url)
    assert not done and download.have == set(range(BAD)) and download.rejected == 1
    assert fetch.failures == [f"{served.url}: chunk {BAD} does not match its signed sha256"]
    assert download.part.read_bytes()[:BAD * CHUNK] == BIG[:BAD * CHUNK]


def test_a_body_cut_inside_a_block_keeps_the_whole_chunks_before_the_cut(
        tmp_path: Path, origin: Callable[[Callable[[int, int], bytes]], Origin]) -> None:
    served = origin(lambda lo, hi: BIG[lo:BAD * CHUNK + CHUNK // 2])  # then the connection closes
    done, download, fetch = _fetch(tmp_path, served.url)
    assert not done and download.have == set(range(BAD)) and download.rejected == 0
    assert fetch.failures == [f"{served.url}: the body ended early, in chunk {BAD}"]


class Recording(Download):
    """A download that records the bytes each run the writer hands it holds."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.runs: list[int] = []

    def accept_run(self, first: int, data: bytes | bytearray | memoryview) -> int | None:
        self.runs.append(len(data))
        return super().accept_run(first, data)


def test_chunks_from_a_source_that_pauses_land_before_its_body_ends(tmp_path: Path) -> None:
    """The writer takes chunks as they arrive while it keeps up, not when a block is full: a kill loses little."""
    release = threading.Event()

    def pausing(sock: socket.socket, _head: bytes, stop: threading.Event) -> None:
        sock.sendall(f"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 0-{len(BIG) - 1}/{len(BIG)}\r\n"
                     f"Content-Length: {len(BIG)}\r\n\r\n".encode() + BIG[:3 * CHUNK])
        release.wait(20)
        if not stop.is_set():
            sock.sendall(BIG[3 * CHUNK:])

    source = HostileOrigin(pausing)
    download = Recording(tmp_path / "dl", info(BIG, CHUNK), free_bytes=plenty)
    fetch = HttpFetch(HttpSettings(timeout_s=20))
    done: list[bool] = []
    fetching = threading.Thread(target=lambda: done.append(fetch.fetch(download, [f"{source.url}/p"])))
    fetching.start()
    try:
        wait_for(lambda: len(download.have) == 3, 10, "the first three chunks to land while the source pauses")
        assert download.part.read_bytes()[:3 * CHUNK] == BIG[:3 * CHUNK]
    finally:
        release.set()
        fetching.join(30)
        source.stop()
    assert done == [True] and min(download.runs) > 0  # the writer woke only for chunks that had arrived


class Held(Download):
    """A download whose checks wait until ``release`` is set: a writer slower than any source."""

    release = threading.Event()

    def accept_run(self, first: int, data: bytes | bytearray | memoryview) -> int | None:
        assert self.release.wait(30)
        return super().accept_run(first, data)


def test_a_writer_that_lags_bounds_what_is_read_ahead_to_write_ahead_blocks(tmp_path: Path) -> None:
    root = tmp_path / "served"
    root.mkdir()
    (root / "payload").write_bytes(BIG)
    server = RangeServer(root).start()
    Held.release.clear()
    download = Held(tmp_path / "dl", info(BIG, BLOCK_BYTES), free_bytes=plenty)  # one chunk per block
    fetch = HttpFetch(HttpSettings(timeout_s=20))
    done: list[bool] = []
    fetching = threading.Thread(target=lambda: done.append(fetch.fetch(download, [server.url_of("payload")])))
    fetching.start()
    try:
        wait_for(lambda: fetch.bytes_received == WRITE_AHEAD * BLOCK_BYTES, 10, "the reader to fill every block")
        fetching.join(0.5)
        assert fetching.is_alive() and fetch.bytes_received == WRITE_AHEAD * BLOCK_BYTES  # and waits there
    finally:
        Held.release.set()
        fetching.join(30)
        server.stop()
    assert done == [True] and download.finish().read_bytes() == BIG
