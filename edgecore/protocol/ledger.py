"""What this device has accepted: the last controller sequence number and each model's version.

Persisted so that a replayed or reordered command, or an old package, is refused after a restart
too (TUF's rollback and freeze attacks)."""

from __future__ import annotations

import threading
from pathlib import Path

from edgecore.durable import atomic_write_json, read_json
from edgecore.errors import OperationFailed

__all__ = ["Ledger"]


class Ledger:
    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "ledger.json"
        self._lock = threading.Lock()
        data = read_json(self.path) or {}
        self._seq = int(data.get("last_seq", 0))
        self._versions: dict[str, int] = {str(k): int(v) for k, v in data.get("versions", {}).items()}

    @property
    def last_seq(self) -> int:
        return self._seq

    def version(self, name: str) -> int:
        """The highest committed version of model ``name`` (0 when none)."""
        return self._versions.get(name, 0)

    def accept_seq(self, seq: int) -> None:
        """Persist ``seq`` as handled; raise OperationFailed (and keep the old one) when it cannot be saved."""
        with self._lock:
            self._save(max(self._seq, seq), self._versions)

    def commit_version(self, name: str, version: int) -> None:
        with self._lock:
            self._save(self._seq, {**self._versions, name: max(self._versions.get(name, 0), version)})

    def _save(self, seq: int, versions: dict[str, int]) -> None:
        """Write first, then take the new values: memory never runs ahead of the disk."""
        try:
            atomic_write_json(self.path, {"last_seq": seq, "versions": versions})
        except OSError as exc:
            raise OperationFailed(f"cannot save the ledger: {exc.strerror or exc}") from exc
        self._seq, self._versions = seq, versions
