"""Writes that survive a crash or power cut: temp file, fsync, rename, fsync the directory."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["atomic_write", "atomic_write_json", "fsync_dir", "read_json"]


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that a reader sees either the old or the new bytes."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
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
