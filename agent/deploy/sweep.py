"""Keep the state directory bounded: remove what no deployment needs any more.

Run when no deployment is in flight (at start-up, after each job): downloads of payloads no
deployment is fetching, temp files of writers killed mid-write, and backend-selection decisions for
models that are no longer on the device (``selection/selection-<model sha256[:16]>.json``; only the
active and the previous slot's models stay, the ones a rollback may load again).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

from agent.deploy.slots import Slots
from agent.durable import remove_stale_temps
from agent.protocol.manifest import Manifest

__all__ = ["selection_keys", "sweep"]

log = logging.getLogger(__name__)


def selection_keys(slots: Slots) -> set[str]:
    """The selection-cache names of the models on the device (active and previous slot)."""
    keys = set()
    for model in (slots.active(), slots.previous()):
        if model is None:
            continue
        try:
            manifest = Manifest.from_bytes((slots.dir(model.slot) / "manifest.json").read_bytes())
            keys.add(f"selection-{manifest.file(manifest.model).sha256[:16]}.json")
        except Exception as exc:  # an unreadable slot keeps nothing: its model cannot be loaded either
            log.warning("slot %s: cannot read its manifest (%s)", model.slot, exc)
    return keys


def sweep(state_dir: Path, slots: Slots, keep_payloads: Iterable[str] = ()) -> list[str]:
    """Remove leftovers under ``state_dir``; ``keep_payloads`` are sha256s of downloads still wanted. Never raises."""
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
    except OSError as exc:
        log.warning("sweeping %s did not complete: %s", state_dir, exc)
    if removed:
        log.info("removed %d leftover(s): %s", len(removed), ", ".join(removed[:8]))
    return removed


def _files(directory: Path) -> list[Path]:
    return [p for p in directory.iterdir() if p.is_file()] if directory.is_dir() else []
