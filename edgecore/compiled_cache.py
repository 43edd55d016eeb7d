"""Compiled-model caches: what a runtime compiled for an accelerator, kept so that a restart does not compile again.

OpenVINO writes its compiled blobs to ``CACHE_DIR``; onnxruntime's TensorRT provider writes engines and a
timing cache to the paths it is given. Each goes to its own directory under the agent's state directory,
keyed by runtime and version, device and model::

    <state>/compiled/<runtime>-<version>/<device>/<model sha256[:16]>/

so a runtime upgrade or another device never reads a stale blob, and the sweep can drop what no model on
the device needs (``sweep_compiled``). Each key's ``load.json`` keeps the first (compiling) load's time, so
every later load reports both: the figure a cache is for.

The agent names the root once (``use_root``); it travels in the environment, so the staging and
measuring child processes use the same caches.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgecore.durable import atomic_write

__all__ = ["ENV", "MAX_BYTES", "CacheEntry", "LoadFigures", "cache_root", "entry_for", "sweep_compiled", "use_root"]

ENV = "EDGE_COMPILED_CACHE"  # outside the EDGE_AGENT_ prefix: that one is the configuration's
# Bound on the whole cache: TensorRT engines of large models run to hundreds of MB each.
MAX_BYTES = 2 * 1024**3
_LOAD_FILE = "load.json"


def use_root(root: Path | None) -> None:
    """Make ``root`` the cache of this process and its children (None: no cache)."""
    if root is None:
        os.environ.pop(ENV, None)
    else:
        root.mkdir(parents=True, exist_ok=True)
        os.environ[ENV] = str(root)


def cache_root() -> Path | None:
    """The cache root this process was given, if any."""
    value = os.environ.get(ENV)
    return Path(value) if value else None


@dataclass(frozen=True)
class LoadFigures:
    """One load: whether the cache held the compiled model (``hit``, ``miss``, ``off``), this load's time and the
    first (compiling) load's time for the same key when known."""

    cache: str
    load_ms: float
    first_load_ms: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"cache": self.cache, "load_ms": self.load_ms,
                **({"first_load_ms": self.first_load_ms} if self.first_load_ms is not None else {})}


@dataclass(frozen=True)
class CacheEntry:
    """One key's directory; ``marker`` is the glob of the files the runtime writes there (``*.blob``, ``*.engine``)."""

    path: Path
    marker: str

    def holds_compiled(self) -> bool:
        """Whether the runtime left a compiled model here (before a load: it will be a hit)."""
        return self.path.is_dir() and any(self.path.glob(self.marker))

    def record(self, hit: bool, load_ms: float) -> LoadFigures:
        """Note one load; the first compiling load's time is kept for the later ones."""
        os.utime(self.path)  # the sweep drops the least recently used key first
        first = self._first()
        if not hit and first is None:
            atomic_write(self.path / _LOAD_FILE, json.dumps({"first_load_ms": round(load_ms, 2)}).encode())
        return LoadFigures("hit" if hit else "miss", round(load_ms, 2), first if hit else None)

    def _first(self) -> float | None:
        try:
            value = json.loads((self.path / _LOAD_FILE).read_text())["first_load_ms"]
            return float(value) if isinstance(value, (int, float)) else None
        except (OSError, ValueError, KeyError, TypeError):
            return None


def entry_for(root: Path, runtime: str, version: str, device: str, model_sha256: str, marker: str) -> CacheEntry:
    """The directory for one runtime version, device and model (created)."""
    path = root / _safe(f"{runtime}-{version}") / _safe(device) / model_sha256[:16]
    path.mkdir(parents=True, exist_ok=True)
    return CacheEntry(path, marker)


def sweep_compiled(root: Path, keep: set[str], max_bytes: int = MAX_BYTES) -> list[str]:
    """Remove the keys of models not in ``keep`` (sha256[:16]), then the least recently used until the cache fits
    ``max_bytes``; returns what was removed, relative to ``root``."""
    if not root.is_dir():
        return []
    entries = [e for e in root.glob("*/*/*") if e.is_dir()]
    removed = []
    for entry in entries:
        if entry.name not in keep:
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(str(entry.relative_to(root)))
    live = sorted((e for e in entries if e.is_dir()), key=lambda e: e.stat().st_mtime)
    total = sum(_size(e) for e in live)
    for entry in live:
        if total <= max_bytes:
            break
        total -= _size(entry)
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(str(entry.relative_to(root)))
    for empty in sorted(root.glob("*/*"), reverse=True) + sorted(root.glob("*"), reverse=True):
        if empty.is_dir() and not any(empty.iterdir()):
            empty.rmdir()
    return removed


def _size(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())


def _safe(name: str) -> str:
    """A path component from a version or device name (``GPU.0``, ``2026.4.1``): no separators, no dot-dot."""
    return re.sub(r"[^A-Za-z0-9_.+-]", "_", name).lstrip(".") or "_"
