"""Writes that survive a crash or power cut: temp file, fsync, rename, fsync the directory.

The one atomic-write helper of the project (the agent's state, the quantizer's outputs, the fleet
PKI). The temp file has a unique name beside the target, so concurrent writers never share one;
a write that fails (a full disk) removes its temp file. Only a process killed in the middle of a
write leaves a ``.<name>.*.tmp`` behind: :func:`remove_stale_temps` clears those where a single
process owns the directory (the agent's state directory), and never one that a thread of this
process is writing (the agent sweeps after each job while its dispatch thread may be saving the
job queue: that write failed with ENOENT when the sweep took its temp file).
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

__all__ = ["TEMP_SUFFIX", "atomic_write", "atomic_write_json", "fsync_dir", "read_json", "remove_stale_temps"]

TEMP_SUFFIX = ".tmp"
_writing: set[str] = set()  # temp files this process is writing now
_writing_lock = threading.Lock()


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` so that a reader sees either the old or the new bytes, even after a power cut.

    The file gets ``mode`` before a byte is written, so a private key never exists with looser
    permissions. Raises OSError (ENOSPC on a full disk) with no temp file left behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with _writing_lock:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMP_SUFFIX, dir=path.parent)
        _writing.add(os.path.realpath(tmp))
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    finally:
        with _writing_lock:
            _writing.discard(os.path.realpath(tmp))
    fsync_dir(path.parent)


def atomic_write_json(path: Path, data: Any) -> None:
    atomic_write(path, json.dumps(data, indent=1, sort_keys=True).encode())


def read_json(path: Path) -> Any | None:
    """The JSON in ``path``, or None when it is missing or unreadable (a torn write is impossible)."""
    try:
        return json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return None


def remove_stale_temps(directory: Path) -> int:
    """Delete the temp files that killed writers left in ``directory`` (not those this process is writing); how many."""
    removed = 0
    with _writing_lock:  # held while deleting: no write of this process starts on a name being judged
        for leftover in directory.glob(f".*{TEMP_SUFFIX}"):
            if os.path.realpath(leftover) in _writing:
                continue
            leftover.unlink(missing_ok=True)
            removed += 1
    return removed
