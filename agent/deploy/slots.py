"""A/B model slots and the pointer that says which one is active, switched atomically."""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agent.durable import atomic_write_json, read_json

__all__ = ["ActiveModel", "Slots"]

@dataclass(frozen=True)
class ActiveModel:
    """What a slot holds: the signed manifest bytes and where the model file is."""

    slot: str
    name: str
    version: int
    manifest_sha256: str

    @classmethod
    def from_json(cls, data: Any) -> ActiveModel | None:
        try:
            return cls(str(data["slot"]), str(data["name"]), int(data["version"]), str(data["manifest_sha256"]))
        except (KeyError, TypeError, ValueError):
            return None


class Slots:
    """``<state>/slots/{a,b}`` and ``<state>/active.json`` = {active, previous}."""

    def __init__(self, state_dir: Path) -> None:
        self.root = state_dir / "slots"
        self.pointer = state_dir / "active.json"
        self.root.mkdir(parents=True, exist_ok=True)

    def dir(self, slot: str) -> Path:
        return self.root / slot

    def _read(self) -> tuple[ActiveModel | None, ActiveModel | None]:
        data = read_json(self.pointer) or {}
        return ActiveModel.from_json(data.get("active")), ActiveModel.from_json(data.get("previous"))

    def active(self) -> ActiveModel | None:
        return self._read()[0]

    def previous(self) -> ActiveModel | None:
        return self._read()[1]

    def spare(self) -> str:
        """The slot not holding the active model: the one a new model is unpacked into."""
        active = self.active()
        return "b" if active is not None and active.slot == "a" else "a"

    def prepare_spare(self) -> Path:
        """Empty the spare slot (never the active one) and return its directory."""
        target = self.dir(self.spare())
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        return target

    def activate(self, model: ActiveModel) -> None:
        """Point at ``model``; the model active until now becomes the rollback target."""
        current = self.active()
        if current == model:
            return
        self._write(model, current)

    def roll_back(self) -> ActiveModel | None:
        """Point back at the previous model (or at nothing); return what is active afterwards."""
        previous = self.previous()
        self._write(previous, None)
        return previous

    def _write(self, active: ActiveModel | None, previous: ActiveModel | None) -> None:
        atomic_write_json(self.pointer, {
            "active": asdict(active) if active else None,
            "previous": asdict(previous) if previous else None,
        })
