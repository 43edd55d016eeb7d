"""Loads the active slot's model on the backend chosen by measurement and serves it locally."""

from __future__ import annotations

import contextlib
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agent.backends import Runner
from agent.deploy.golden import load_golden
from agent.deploy.slots import ActiveModel, Slots
from agent.guard import CrashLoopGuard
from agent.hardware import Hardware
from agent.protocol.manifest import Manifest
from agent.selection import Selection, select_backend
from agent.serving import ModelRegistry
from agent.shadow import Agreement, measure_agreement, shadow_inputs
from agent.tensors import model_precision

__all__ = ["LoadedModel", "ModelHost"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadedModel:
    active: ActiveModel
    manifest: Manifest
    selection: Selection
    runner: Runner

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.active.name, "version": self.active.version, "slot": self.active.slot,
            "artifact_id": self.manifest.artifact_id, "backend": self.selection.backend,
        }


class ModelHost:
    """Keeps exactly one model published in the registry: the one the slot pointer names."""

    def __init__(self, slots: Slots, registry: ModelRegistry, hardware: Hardware, cache_dir: Path, budget_s: float,
                 guard: CrashLoopGuard | None = None) -> None:
        self.slots = slots
        self.guard = guard  # counts the deaths of this process while it loads and measures a model
        self.registry = registry
        self.hardware = hardware
        self.cache_dir = cache_dir
        self.budget_s = budget_s
        self._lock = threading.Lock()
        self.current: LoadedModel | None = None

    def manifest_of(self, active: ActiveModel) -> Manifest:
        return Manifest.from_bytes((self.slots.dir(active.slot) / "manifest.json").read_bytes())

    def golden_of(self, active: ActiveModel, manifest: Manifest) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        if manifest.golden is None:
            return {}, {}
        return load_golden(self.slots.dir(active.slot) / manifest.golden)

    def load(self, active: ActiveModel, remeasure: bool = False, deployment_id: str | None = None) -> LoadedModel:
        """Choose a backend for ``active`` (cached by model, hardware and runtimes) and publish it.

        ``deployment_id``: the deployment installing ``active``, for the crash-loop guard's record."""
        manifest = self.manifest_of(active)
        inputs, expected = self.golden_of(active, manifest)
        with self.guard.watch(active, deployment_id) if self.guard else contextlib.nullcontext():
            selection = select_backend(
                self.slots.dir(active.slot) / manifest.model,
                hardware=self.hardware,
                allowed_providers=list(manifest.target.execution_providers) or None,
                golden=inputs or None,
                expected=expected or None,
                cache_dir=self.cache_dir,
                time_budget_s=self.budget_s,
                remeasure=remeasure,
            )
            runner = selection.open()
        loaded = LoadedModel(active, manifest, selection, runner)
        with self._lock:
            previous = self.current
            self.registry.publish(active.name, str(active.version), runner, loaded.summary())
            if previous is not None and previous.active.name != active.name:
                self.registry.unpublish(previous.active.name)
            self.current = loaded
        log.info("serving %s v%d on %s", active.name, active.version, selection.backend)
        return loaded

    def shadow(self, slot_dir: Path, manifest: Manifest) -> Agreement:
        """Run the staged model in ``slot_dir`` beside the served one, on the backend serving now."""
        current = self.current
        assert current is not None
        golden = load_golden(slot_dir / manifest.golden)[0] if manifest.golden else {}
        with current.selection.candidate.open(slot_dir / manifest.model) as new:
            feeds, live = shadow_inputs(golden, self.registry.recent_inputs(current.active.name), new.inputs)

            def old(feed: dict[str, np.ndarray]) -> dict[str, Any]:
                with self.registry.acquire(current.active.name) as entry:
                    return dict(entry.runner.infer(feed))

            precision = model_precision(slot_dir / manifest.model)  # the new model's tolerance, not fp32's
            return measure_agreement(old, lambda feed: dict(new.infer(feed)), feeds, live, precision=precision)

    def unload(self) -> None:
        with self._lock:
            if self.current is not None:
                self.registry.unpublish(self.current.active.name)
            self.current = None
