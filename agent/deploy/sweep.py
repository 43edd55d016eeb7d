"""Keep the state directory bounded: remove what no deployment needs any more.

Run when no deployment is in flight (at start-up, after each job): downloads of payloads no
deployment is fetching, temp files of writers killed mid-write, the directories of models the slot
pointer no longer names (a removal cut short by a power cut), and backend-selection decisions,
measured footprints and compiled models (``edgecore.compiled_cache``, itself bounded in bytes) for
models that are no longer on the device (``selection/selection-<model sha256[:16]>.json``,
``footprints.json``, ``compiled/*/*/<sha256[:16]>``; only each name's active and previous slot's
models stay, the ones a rollback may load again). So the directory is bounded per model.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterable
from pathlib import Path

from agent.deploy.slots import Slots
from agent.footprint import FootprintBook, footprint_key
from edgecore.compiled_cache import sweep_compiled
from edgecore.durable import remove_stale_temps
from edgecore.protocol.manifest import Manifest

__all__ = ["selection_keys", "sweep"]

log = logging.getLogger(__name__)


def _manifests(slots: Slots) -> list[Manifest]:
    """The manifests of every name's active and previous slot."""
    manifests = []
    for pair in slots.table().values():
        for model in (pair.active, pair.previous):
            if model is None:
                continue
            try:
                manifests.append(Manifest.from_bytes((slots.dir(model.slot) / "manifest.json").read_bytes()))
            except Exception as exc:  # an unreadable slot keeps nothing: its model cannot be loaded either
                log.warning("slot %s: cannot read its manifest (%s)", model.slot, exc)
    return manifests


def selection_keys(slots: Slots) -> set[str]:
    """The selection-cache names of the models on the device (each name's active and previous slot)."""
    return {f"selection-{footprint_key(m)}.json" for m in _manifests(slots) if not m.is_pipeline}


def sweep(state_dir: Path, slots: Slots, keep_payloads: Iterable[str] = (), keep_names: Iterable[str] = ()) -> list[str]:
    """Remove leftovers under ``state_dir``; ``keep_payloads`` are sha256s of downloads still wanted, ``keep_names``
    models whose directories a resumed deployment still needs. Never raises."""
    removed: list[str] = []
    try:
        for directory in (state_dir, state_dir / "selection", state_dir / "downloads"):
            if directory.is_dir():
                removed += [f"{directory.name}/.tmp"] * remove_stale_temps(directory)
        keep = set(keep_payloads)
        for part in _files(state_dir / "downloads"):
            if part.name.split(".")[0] not in keep:
                part.unlink(missing_ok=True)
                removed.append(f"downloads/{part.name}")
        wanted = selection_keys(slots)
        for decision in _files(state_dir / "selection"):
            if decision.name.startswith("selection-") and decision.name not in wanted:
                decision.unlink(missing_ok=True)
                removed.append(f"selection/{decision.name}")
        models = {key.removeprefix("selection-").removesuffix(".json") for key in wanted}
        removed += [f"compiled/{key}" for key in sweep_compiled(state_dir / "compiled", models)]
        removed += [f"footprints/{key}" for key in FootprintBook(state_dir / "footprints.json").prune(
            {footprint_key(m) for m in _manifests(slots)})]
        named = {*slots.names(), *keep_names}
        for directory in [d for d in slots.root.iterdir() if d.is_dir() and d.name not in named]:
            shutil.rmtree(directory, ignore_errors=True)
            removed.append(f"models/{directory.name}")
    except OSError as exc:
        log.warning("sweeping %s did not complete: %s", state_dir, exc)
    if removed:
        log.info("removed %d leftover(s): %s", len(removed), ", ".join(removed[:8]))
    return removed


def _files(directory: Path) -> list[Path]:
    return [p for p in directory.iterdir() if p.is_file()] if directory.is_dir() else []
