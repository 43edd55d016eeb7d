"""A/B slots per model and the one pointer that says which slot of each model is active, switched atomically.

``<state>/models/<name>/{a,b}`` hold each model's (or pipeline's) two versions; ``<state>/models.json``
names, per name, the active slot and the previous one (the rollback target). The whole table is one
file written atomically, so one write can switch several models at once: a pipeline and its models
move together, and a power cut leaves either every one of them switched or none.

An agent from before sets kept one model in ``<state>/slots/{a,b}`` under ``<state>/active.json``;
:class:`Slots` moves that into the new layout at start (each step redone safely after a power cut).
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from edgecore.durable import atomic_write_json, read_json
from edgecore.errors import ProtocolError
from edgecore.protocol.topics import validate_id

__all__ = ["POINTER_SCHEMA", "ActiveModel", "SlotPair", "Slots"]

log = logging.getLogger(__name__)

POINTER_SCHEMA = 2  # schema 1 was active.json's single {active, previous}


@dataclass(frozen=True)
class ActiveModel:
    """What a slot holds: the model (or pipeline) named in its signed manifest, and who installed it.

    ``slot`` is the slot's directory under ``<state>/models``: ``<name>/a`` or ``<name>/b``."""

    slot: str
    name: str
    version: int
    manifest_sha256: str
    kind: str = "model"  # or "pipeline"
    deployment_id: str = ""  # the deployment that installed it ("" in pointers from before sets)

    @classmethod
    def from_json(cls, data: Any) -> ActiveModel | None:
        try:
            return cls(str(data["slot"]), str(data["name"]), int(data["version"]), str(data["manifest_sha256"]),
                       str(data.get("kind", "model")), str(data.get("deployment_id", "")))
        except (KeyError, TypeError, ValueError, AttributeError):
            return None


@dataclass(frozen=True)
class SlotPair:
    """One name's entry in the pointer: the active slot and the rollback target."""

    active: ActiveModel
    previous: ActiveModel | None = None

    def to_json(self) -> dict[str, Any]:
        return {"active": asdict(self.active), "previous": asdict(self.previous) if self.previous else None}


class Slots:
    """``<state>/models/<name>/{a,b}`` and ``<state>/models.json`` = {name: {active, previous}}."""

    def __init__(self, state_dir: Path) -> None:
        self.root = state_dir / "models"
        self.pointer = state_dir / "models.json"
        self.root.mkdir(parents=True, exist_ok=True)
        _migrate(state_dir, self)

    def dir(self, slot: str) -> Path:
        return self.root / slot

    # -- reading ----------------------------------------------------------------------------------

    def table(self) -> dict[str, SlotPair]:
        """Every name on the device with its active and previous slot."""
        raw = read_json(self.pointer)
        entries = raw.get("models") if isinstance(raw, dict) and raw.get("schema") == POINTER_SCHEMA else None
        table: dict[str, SlotPair] = {}
        for name, pair in (entries or {}).items():
            active = ActiveModel.from_json(pair.get("active")) if isinstance(pair, dict) else None
            if active is not None:
                table[str(name)] = SlotPair(active, ActiveModel.from_json(pair.get("previous")))
        return table

    def names(self) -> list[str]:
        return sorted(self.table())

    def active(self, name: str) -> ActiveModel | None:
        pair = self.table().get(name)
        return None if pair is None else pair.active

    def previous(self, name: str) -> ActiveModel | None:
        pair = self.table().get(name)
        return None if pair is None else pair.previous

    def actives(self) -> dict[str, ActiveModel]:
        return {name: pair.active for name, pair in self.table().items()}

    def spare(self, name: str) -> str:
        """The slot of ``name`` not holding its active model: the one a new version is unpacked into."""
        validate_id(name, "model name")
        active = self.active(name)
        return f"{name}/b" if active is not None and active.slot == f"{name}/a" else f"{name}/a"

    # -- writing ----------------------------------------------------------------------------------

    def prepare_spare(self, name: str) -> Path:
        """Empty the spare slot of ``name`` (never an active one) and return its directory."""
        target = self.dir(self.spare(name))
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        return target

    def activate(self, *models: ActiveModel) -> None:
        """Point at every one of ``models`` in one write; the model each replaces becomes its rollback target."""
        table = self.table()
        for model in models:
            current = table.get(model.name)
            if current is None or current.active != model:
                table[model.name] = SlotPair(model, current.active if current else None)
        self._write(table)

    def roll_back(self, *names: str) -> dict[str, ActiveModel | None]:
        """Point each name back at its previous model (or at nothing), in one write; return what is active after."""
        table = self.table()
        after: dict[str, ActiveModel | None] = {}
        for name in names:
            pair = table.pop(name, None)
            previous = pair.previous if pair else None
            if previous is not None:
                table[name] = SlotPair(previous)
            after[name] = previous
        self._write(table)
        return after

    def relabel(self, name: str, deployment_id: str) -> None:
        """Record that ``deployment_id`` now stands for ``name``'s active model (a rollout found it already there)."""
        table = self.table()
        pair = table.get(name)
        if pair is not None:
            table[name] = SlotPair(dataclasses.replace(pair.active, deployment_id=deployment_id), pair.previous)
            self._write(table)

    def remove(self, names: Iterable[str]) -> None:
        """Forget ``names`` in one write (their directories are removed by the caller or the next sweep)."""
        table = self.table()
        for name in names:
            table.pop(name, None)
        self._write(table)

    def _write(self, table: Mapping[str, SlotPair]) -> None:
        atomic_write_json(self.pointer, {"schema": POINTER_SCHEMA,
                                         "models": {name: pair.to_json() for name, pair in sorted(table.items())}})


def _migrate(state_dir: Path, slots: Slots) -> None:
    """Move an agent-from-before-sets' single model (``slots/{a,b}``, ``active.json``) under ``models/<name>/``.

    Each step is safe to redo: the directories move first, the new pointer is written, then the old
    one removed. A previous model of another name than the active one is not kept (it was no
    rollback target of that model)."""
    old_pointer, old_root = state_dir / "active.json", state_dir / "slots"
    if not old_pointer.exists():
        return
    if not slots.pointer.exists():
        raw = read_json(old_pointer) or {}
        active = ActiveModel.from_json(raw.get("active"))
        previous = ActiveModel.from_json(raw.get("previous"))
        table: dict[str, SlotPair] = {}
        try:
            if active is not None:
                validate_id(active.name, "model name")
                moved = [_moved(m, old_root, slots) for m in (active, previous) if m is not None and m.name == active.name]
                table[active.name] = SlotPair(moved[0], moved[1] if len(moved) > 1 else None)
        except ProtocolError as exc:  # a name no set could hold: the controller installs it again under a valid one
            log.error("cannot keep the model of an agent from before sets: %s", exc)
        slots._write(table)
        log.info("moved the model of an agent from before sets into %s", slots.root)
    old_pointer.unlink(missing_ok=True)
    shutil.rmtree(old_root, ignore_errors=True)


def _moved(model: ActiveModel, old_root: Path, slots: Slots) -> ActiveModel:
    new = ActiveModel(f"{model.name}/{model.slot}", model.name, model.version, model.manifest_sha256)
    source, target = old_root / model.slot, slots.dir(new.slot)
    if source.is_dir() and not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        source.rename(target)
    return new
