"""One artifact arriving in chunks, in any order, any number of times, across restarts.

Chunks are written at their offset into a ``.part`` file; that file is the durable record of what
has arrived: after a restart each chunk slot is re-hashed against the signed chunk hashes, so only
chunks that really landed count, whatever a power cut did to the last writes. While a download
runs, the ``.part`` file stays open: a chunk costs one hash and one positioned write, nothing that
grows with the number of chunks already there.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from agent.errors import OperationFailed
from agent.protocol.chunks import to_ranges
from agent.protocol.manifest import PayloadInfo

__all__ = ["Download", "disk_free", "remove_download"]

# Room needed beyond the payload itself: the extracted files take about as much again.
SPACE_FACTOR = 2.2


def disk_free(path: Path) -> int:
    return shutil.disk_usage(path).free


def remove_download(directory: Path, payload: PayloadInfo) -> None:
    """Delete what a download of ``payload`` left in ``directory`` (without opening one: that would preallocate)."""
    for suffix in (".part", ".payload"):
        (directory / f"{payload.sha256}{suffix}").unlink(missing_ok=True)


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
        self._run_io(lambda: self._write(index, data))
        self.have.add(index)
        self.have_bytes += len(data)
        return True

    def chunk_length(self, index: int) -> int:
        """The exact size of chunk ``index`` that the signed manifest implies."""
        return min(self.payload.chunk_size, self.payload.size - index * self.payload.chunk_size)

    def _write(self, index: int, data: bytes) -> None:
        if self.quota_bytes is not None and self.have_bytes + len(data) > self.quota_bytes:
            raise OSError(errno.ENOSPC, f"download quota of {self.quota_bytes} bytes reached")
        if self._file is None:
            self._file = self.part.open("r+b", buffering=0)
        fd, view, offset = self._file.fileno(), memoryview(data), index * self.payload.chunk_size
        while view:  # a regular file takes it all at once, except on a full disk or a signal
            written = os.pwrite(fd, view, offset)
            view, offset = view[written:], offset + written

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
            os.fsync(self._file.fileno())
            self.close()
            os.replace(self.part, self.done_path)
        self._finished = True
        return self.done_path

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
