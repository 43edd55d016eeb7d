"""An artifact's chunks landing on the device: room checked first, every chunk against its signed hash and
exact length, a quota as a small disk would enforce it, and only chunks really on disk counted after a restart."""

from __future__ import annotations

import hashlib
import resource
import signal
from pathlib import Path

import pytest

from edgecore.delivery.download import SPACE_FACTOR, Download, remove_download
from edgecore.errors import OperationFailed
from edgecore.protocol.manifest import PayloadInfo

DATA = b"".join(hashlib.sha256(bytes([i])).digest() for i in range(80))  # 2560 bytes: chunks of 1024, 1024 and 512


def info(data: bytes = DATA, chunk: int = 1024) -> PayloadInfo:
    pieces = [data[i:i + chunk] for i in range(0, len(data), chunk)]
    return PayloadInfo(len(data), hashlib.sha256(data).hexdigest(), chunk, tuple(hashlib.sha256(p).hexdigest() for p in pieces))


def piece(index: int) -> bytes:
    return DATA[index * 1024:(index + 1) * 1024]


def plenty(_path: Path) -> int:
    return 10**12


def test_the_chunks_complete_the_payload_in_any_order(tmp_path: Path) -> None:
    download = Download(tmp_path, info(), free_bytes=plenty)
    assert download.missing() == [[0, 3]] and [download.chunk_length(i) for i in range(3)] == [1024, 1024, 512]
    assert download.accept(2, piece(2)) and download.missing() == [[0, 2]]
    assert not download.accept(2, piece(2))  # a duplicate changes nothing
    assert download.accept(0, piece(0)) and not download.complete and download.missing() == [[1, 2]]
    assert download.accept(1, piece(1)) and download.complete and download.missing() == []
    path = download.finish()
    assert path.read_bytes() == DATA and path.name.endswith(".payload") and not download.part.exists()
    assert not download.accept(0, piece(0))  # a finished download takes nothing more
    assert Download(tmp_path, info(), free_bytes=plenty).complete  # and a restart finds it finished


@pytest.mark.parametrize(("index", "data"), [(-1, piece(0)), (3, piece(0)), (0, piece(0)[:-1]), (0, piece(0) + b"\0"),
                                             (2, piece(2) + b"\0"), (0, piece(1)), (1, b""), (2, b"\1" + piece(2)[1:])])
def test_a_chunk_of_the_wrong_index_length_or_hash_is_refused_and_counted(tmp_path: Path, index: int, data: bytes) -> None:
    download = Download(tmp_path, info(), free_bytes=plenty)
    assert not download.accept(index, data)
    assert download.rejected == 1 and download.have == set() and download.have_bytes == 0


def test_room_for_the_payload_and_its_extraction_is_checked_first(tmp_path: Path) -> None:
    assert SPACE_FACTOR == 2.2  # the payload, the files extracted from it (about as much again), and a margin
    needed = int(len(DATA) * SPACE_FACTOR)
    Download(tmp_path / "a", info(), free_bytes=lambda _p: needed)
    with pytest.raises(OperationFailed, match=f"need {needed} bytes, {needed - 1} free"):
        Download(tmp_path / "b", info(), free_bytes=lambda _p: needed - 1)
    assert not (tmp_path / "b" / f"{info().sha256}.part").exists()


def test_a_resumed_download_needs_room_only_for_what_is_missing(tmp_path: Path) -> None:
    first = Download(tmp_path, info(), free_bytes=plenty)
    first.accept(0, piece(0))
    first.close()
    needed = int(len(DATA) * SPACE_FACTOR) - len(DATA)  # the .part file already holds the payload's size
    Download(tmp_path, info(), free_bytes=lambda _p: needed)
    with pytest.raises(OperationFailed):
        Download(tmp_path, info(), free_bytes=lambda _p: needed - 1)


def test_after_a_restart_only_chunks_that_match_their_hash_count(tmp_path: Path) -> None:
    first = Download(tmp_path, info(), free_bytes=plenty)
    first.accept(0, piece(0))
    first.accept(2, piece(2))
    first.close()
    with first.part.open("r+b") as part:  # a power cut tore chunk 2
        part.seek(2048)
        part.write(b"\xff")
    again = Download(tmp_path, info(), free_bytes=plenty)
    assert again.have == {0} and again.have_bytes == 1024 and again.missing() == [[1, 3]]


def test_a_part_file_of_another_size_starts_over(tmp_path: Path) -> None:
    part = tmp_path / f"{info().sha256}.part"
    part.write_bytes(DATA[:1024])
    download = Download(tmp_path, info(), free_bytes=plenty)
    assert download.have == set() and part.stat().st_size == len(DATA)


def test_the_quota_is_a_full_disk(tmp_path: Path) -> None:
    download = Download(tmp_path, info(), free_bytes=plenty, quota_bytes=2048)
    assert download.accept(0, piece(0)) and download.accept(1, piece(1))  # exactly the quota
    with pytest.raises(OperationFailed, match="disk full while downloading"):
        download.accept(2, piece(2))
    assert not download.part.exists()  # the download is removed: a full disk needs the room back


def test_remove_download_clears_both_files(tmp_path: Path) -> None:
    download = Download(tmp_path, info(), free_bytes=plenty)
    download.close()
    (tmp_path / f"{info().sha256}.payload").write_bytes(b"x")
    remove_download(tmp_path, info())
    assert list(tmp_path.iterdir()) == []


def test_a_finished_download_reopened_needs_no_room_and_writes_nothing(tmp_path: Path) -> None:
    first = Download(tmp_path, info(), free_bytes=plenty)
    for index in range(3):
        first.accept(index, piece(index))
    first.finish()
    again = Download(tmp_path, info(), free_bytes=lambda _p: 0)  # a full disk: nothing to write
    assert again.complete and again.missing() == [] and not again.part.exists()
    assert again.finish().read_bytes() == DATA


def test_a_download_resumed_complete_is_finished_without_writing(tmp_path: Path) -> None:
    first = Download(tmp_path, info(), free_bytes=plenty)
    for index in range(3):
        first.accept(index, piece(index))
    first.close()
    again = Download(tmp_path, info(), free_bytes=plenty)  # every chunk found on disk: no file opened yet
    assert again.complete and again.finish().read_bytes() == DATA


def test_one_past_the_last_chunk_is_refused_even_when_it_would_be_empty(tmp_path: Path) -> None:
    exact = DATA[:2048]  # two whole chunks: "chunk 2" would be 0 bytes long
    download = Download(tmp_path, info(exact), free_bytes=plenty)
    assert not download.accept(2, b"") and download.rejected == 1


def test_a_download_in_a_new_directory_creates_it(tmp_path: Path) -> None:
    download = Download(tmp_path / "state" / "downloads", info(), free_bytes=plenty)
    assert download.part.exists() and download.part.stat().st_size == len(DATA)


def test_a_write_the_kernel_refuses_for_another_reason_fails_the_download_and_removes_it(tmp_path: Path) -> None:
    """A file-size limit (RLIMIT_FSIZE, EFBIG) below the payload: not a full disk, still one line and no leftovers."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1000, hard))
    try:
        with pytest.raises(OperationFailed, match="cannot write download"):
            Download(tmp_path, info(), free_bytes=plenty)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
    assert list(tmp_path.iterdir()) == []
