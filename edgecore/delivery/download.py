"""One artifact arriving in chunks, in any order, any number of times, across restarts.

Chunks are written at their offset into a ``.part`` file; that file is the durable record of what
has arrived: after a restart each chunk slot is re-hashed against the signed chunk hashes, so only
chunks that really landed count, whatever a power cut did to the last writes. While a download
runs, the ``.part`` file stays open: a chunk costs one hash and one positioned write, nothing that
grows with the number of chunks already there; :meth:`Download.accept_run` takes consecutive chunks
in one write. The payload is fsynced before it is renamed; while it fills, every ``FLUSH_BYTES``
written are handed to one flusher thread per process (``fdatasync`` of a duplicate descriptor), so
the disk writes them back while the next chunks arrive and that last fsync has only the tail left.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import queue
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from edgecore.errors import OperationFailed
from edgecore.protocol.chunks import to_ranges
from edgecore.protocol.manifest import PayloadInfo

__all__ = ["Download", "disk_free", "remove_download"]

# Room needed beyond the payload itself: the extracted files take about as much again.
SPACE_FACTOR = 2.2
FLUSH_BYTES = 4 * 1024 * 1024  # written since the last background flush before the next one is asked for


def disk_free(path: Path) -> int:
    return shutil.disk_usage(path).free


def remove_download(directory: Path, payload: PayloadInfo) -> None:
    """Delete what a download of ``payload`` left in ``directory`` (without opening one: that would preallocate)."""
    for suffix in (".part", ".payload"):
        (directory / f"{payload.sha256}{suffix}").unlink(missing_ok=True)


class _Flusher:
    """One thread per process that fdatasyncs ``.part`` files while they fill; see the module docstring.

    Each job holds its own duplicate of the descriptor, so the download may close (or finish, or
    discard) its file at any time. A write-back error is reported once per open file, to whichever
    sync sees it first: the flusher hands it to the download, whose next write or finish raises it.
    A job still queued when its download finishes is dropped (the final fsync did its work), so a
    process with many downloads never makes one wait for the others' flushes."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Download, int]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._pid: int | None = None  # the process whose thread takes the jobs: a forked child starts its own

    def submit(self, download: Download, fd: int) -> None:
        """Have ``fd`` fdatasynced soon for ``download`` (whose flush it then begins and ends)."""
        download.queue_flush()
        try:
            copy = os.dup(fd)
        except OSError:  # out of descriptors: the final fsync does it all
            download.end_flush(None)
            return
        with self._lock:
            if self._pid != os.getpid():
                self._jobs, self._pid = queue.SimpleQueue(), os.getpid()
                threading.Thread(target=self._run, args=(self._jobs,), name="download-flusher", daemon=True).start()
            self._jobs.put((download, copy))

    @staticmethod
    def _run(jobs: queue.SimpleQueue[tuple[Download, int]]) -> None:
        while True:
            download, fd = jobs.get()
            error = None
            try:
                if download.begin_flush():
                    os.fdatasync(fd)
            except OSError as exc:
                error = exc
            finally:
                with contextlib.suppress(OSError):
                    os.close(fd)
                download.end_flush(error)


FLUSHER = _Flusher()


class Download:
    """The chunks of one payload landing in ``<dir>/<sha256>.part``."""

    def __init__(self, directory: Path, payload: PayloadInfo, free_bytes: Callable[[Path], int] = disk_free,
                 quota_bytes: int | None = None) -> None:
        self.payload = payload
        # Bytes this download may write, like a filesystem that small (tests use it as a disk-full seam).
        self.quota_bytes = quota_bytes
        self.part = directory / f"{payload.sha256}.part"
        self.done_path = directory / f"{payload.sha256}.payload"
        directory.mkdir(parents=True, exist_ok=True)
        self.have: set[int] = set()
        self.have_bytes = 0  # sum of the lengths of the chunks in ``have``, for the quota
        self.rejected = 0
        self.flushed = threading.Event()  # clear while a background flush of this download is queued or running
        self.flushed.set()
        self.flush_error: OSError | None = None  # what a background flush met; raised by the next write or finish
        self.flushes = 0  # background flushes asked for
        self._unflushed = 0  # bytes written since the last background flush was asked for
        self._flush_lock = threading.Lock()
        self._flush = "idle"  # the background flush: idle, queued, running, or dropped (finish came first)
        self._file: BinaryIO | None = None
        self._finished = False
        if self.done_path.exists():
            self.have = set(range(len(payload.chunks)))
            self._finished = True
            return
        self._check_space(directory, free_bytes)
        if self.part.exists() and self.part.stat().st_size == payload.size:
            self.have = self._chunks_on_disk()
            self.have_bytes = sum(map(self.chunk_length, self.have))
        else:
            self._run_io(lambda: self._preallocate())

    def _check_space(self, directory: Path, free_bytes: Callable[[Path], int]) -> None:
        already = self.part.stat().st_size if self.part.exists() else 0
        needed = int(self.payload.size * SPACE_FACTOR) - already
        free = free_bytes(directory)
        if needed > free:
            raise OperationFailed(
                f"not enough disk space for {self.payload.size} byte payload: need {needed} bytes, {free} free in {directory}"
            )

    def _preallocate(self) -> None:
        with self.part.open("wb") as f:
            f.truncate(self.payload.size)

    def _chunks_on_disk(self) -> set[int]:
        have = set()
        size = self.payload.chunk_size
        with self.part.open("rb") as f:
            for i, digest in enumerate(self.payload.chunks):
                if hashlib.sha256(f.read(size)).hexdigest() == digest:
                    have.add(i)
        return have

    @property
    def complete(self) -> bool:
        return len(self.have) == len(self.payload.chunks)

    def missing(self) -> list[list[int]]:
        return to_ranges(i for i in range(len(self.payload.chunks)) if i not in self.have)

    def accept(self, index: int, data: bytes) -> bool:
        """Store chunk ``index`` if it is new and matches its signed hash; duplicates are harmless."""
        if index in self.have or self._finished:
            return False
        if not 0 <= index < len(self.payload.chunks) or len(data) != self.chunk_length(index):
            # More bytes than the signed manifest promises is an endless-data attack, fewer a torn chunk.
            self.rejected += 1
            return False
        if hashlib.sha256(data).hexdigest() != self.payload.chunks[index]:
            self.rejected += 1
            return False
        self._store(index, memoryview(data))
        return True

    def accept_run(self, first: int, data: bytes | bytearray | memoryview) -> int | None:
        """Store the chunks ``data`` holds back to back from ``first`` on, each checked as :meth:`accept` checks one.

        Chunks already here are skipped. Returns the index of the first chunk that is not as signed (a
        wrong hash, or ``data`` ending inside it): it is counted as rejected, the chunks before it are
        stored and none after it is looked at; None when every chunk was taken. New chunks in a row
        are written with one positioned write."""
        view = memoryview(data)
        offset, index = 0, first
        run, run_offset = first, 0  # the stretch of new, good chunks not yet written: [run, index)
        while offset < len(view) and not self._finished:
            length = self.chunk_length(index)  # past the last chunk: 0 or less
            if index in self.have:
                self._store_run(run, view[run_offset:offset])
                run, run_offset = index + 1, offset + length
            elif index < 0 or length <= 0 or len(view) - offset < length or (
                    hashlib.sha256(view[offset:offset + length]).hexdigest() != self.payload.chunks[index]):
                self._store_run(run, view[run_offset:offset])
                self.rejected += 1
                return index
            offset, index = offset + length, index + 1
        self._store_run(run, view[run_offset:offset])
        return None

    def chunk_length(self, index: int) -> int:
        """The exact size of chunk ``index`` that the signed manifest implies."""
        return min(self.payload.chunk_size, self.payload.size - index * self.payload.chunk_size)

    def _store_run(self, first: int, data: memoryview) -> None:
        """Write the whole chunks ``data`` holds from ``first`` on (nothing when empty) and count them as here."""
        if data:
            self._store(first, data)

    def _store(self, first: int, data: memoryview) -> None:
        self._run_io(lambda: self._write(first, data))
        end = first + -(-len(data) // self.payload.chunk_size)
        self.have.update(range(first, end))
        self.have_bytes += len(data)

    def _write(self, index: int, data: memoryview) -> None:
        if self.flush_error is not None:
            raise self.flush_error
        if self.quota_bytes is not None and self.have_bytes + len(data) > self.quota_bytes:
            raise OSError(errno.ENOSPC, f"download quota of {self.quota_bytes} bytes reached")
        if self._file is None:
            self._file = self.part.open("r+b", buffering=0)
        fd, view, offset = self._file.fileno(), data, index * self.payload.chunk_size
        while view:  # a regular file takes it all at once, except on a full disk or a signal
            written = os.pwrite(fd, view, offset)
            view, offset = view[written:], offset + written
        self._unflushed += len(data)
        if self._unflushed >= FLUSH_BYTES and self.flushed.is_set():
            self._unflushed = 0
            self.flushes += 1
            FLUSHER.submit(self, fd)

    def queue_flush(self) -> None:
        with self._flush_lock:
            self._flush = "queued"
            self.flushed.clear()

    def begin_flush(self) -> bool:
        """The flusher is about to sync this download: False when it no longer needs to (finish came first)."""
        with self._flush_lock:
            if self._flush != "queued":
                return False
            self._flush = "running"
            return True

    def end_flush(self, error: OSError | None) -> None:
        """The flusher is done with this download's job; ``error``: what its fdatasync met."""
        with self._flush_lock:
            self._flush = "idle"
            self.flush_error = self.flush_error or error
            self.flushed.set()

    def close(self) -> None:
        """Release the open ``.part`` file; what was written stays and counts after a restart."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def finish(self) -> Path:
        """fsync the completed payload and give it its final name."""
        if not self.done_path.exists():
            if self._file is None:
                self._file = self.part.open("rb", buffering=0)
            fd = self._file.fileno()
            self._run_io(lambda: self._sync(fd))
            self.close()
            os.replace(self.part, self.done_path)
        self._finished = True
        return self.done_path

    def _sync(self, fd: int) -> None:
        os.fsync(fd)
        with self._flush_lock:
            running = self._flush == "running"
            if self._flush == "queued":  # not begun: it is dropped, this fsync did its work
                self._flush = "dropped"
        if running:  # a write-back error that the background flush sees is not reported to this fsync again
            self.flushed.wait()
        if self.flush_error is not None:
            raise self.flush_error

    def discard(self) -> None:
        self.close()
        remove_download(self.part.parent, self.payload)

    def _run_io(self, action: Callable[[], None]) -> None:
        try:
            action()
        except OSError as exc:
            self.discard()
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise OperationFailed(f"disk full while downloading {self.payload.sha256[:12]}: download removed") from exc
            raise OperationFailed(f"cannot write download {self.part}: {exc.strerror}") from exc
