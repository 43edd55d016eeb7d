"""Splitting an artifact into chunks, and the ranges devices use to ask for missing ones."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from pathlib import Path

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "MAX_CHUNK_SIZE",
    "MIN_CHUNK_SIZE",
    "chunk_digests",
    "chunk_size_for_broker",
    "from_ranges",
    "read_chunk",
    "to_ranges",
]

# 64 KiB works on brokers with a 128 KB maximum packet size (the chunk plus topic and header).
DEFAULT_CHUNK_SIZE = 64 * 1024
MIN_CHUNK_SIZE = 4 * 1024
MAX_CHUNK_SIZE = 8 * 1024 * 1024
# Topic, fixed header, packet id and MQTT 5 properties fit well inside this margin.
PACKET_OVERHEAD = 1024


def chunk_size_for_broker(requested: int, broker_max_packet: int | None) -> int:
    """The chunk size to use: ``requested``, shrunk to fit the broker's announced packet limit."""
    size = max(MIN_CHUNK_SIZE, min(requested, MAX_CHUNK_SIZE))
    if broker_max_packet:
        size = min(size, max(MIN_CHUNK_SIZE, broker_max_packet - PACKET_OVERHEAD))
    return size


def chunk_digests(path: Path, chunk_size: int) -> tuple[str, list[str]]:
    """sha256 of the whole file and of each chunk, in one pass."""
    whole = hashlib.sha256()
    digests = []
    with path.open("rb") as f:
        while block := f.read(chunk_size):
            whole.update(block)
            digests.append(hashlib.sha256(block).hexdigest())
    return whole.hexdigest(), digests


def read_chunk(path: Path, index: int, chunk_size: int) -> bytes:
    with path.open("rb") as f:
        f.seek(index * chunk_size)
        return f.read(chunk_size)


def to_ranges(indices: Iterable[int]) -> list[list[int]]:
    """Compress sorted-or-not chunk indices into [start, end) ranges."""
    ranges: list[list[int]] = []
    for i in sorted(set(indices)):
        if ranges and ranges[-1][1] == i:
            ranges[-1][1] = i + 1
        else:
            ranges.append([i, i + 1])
    return ranges


def from_ranges(ranges: Iterable[Iterable[int]], count: int) -> Iterator[int]:
    """Expand [start, end) ranges, clipped to ``count`` chunks."""
    for start, end in ranges:
        yield from range(max(0, start), min(end, count))
