"""Loads each active model on the backend chosen by measurement, and each pipeline over them, and serves them locally.

Every model and pipeline is published under its own name; loading, switching or unloading one
never touches another's registry entry, so its requests go on. A pipeline's runner holds the
entries of its models (``agent.pipeline_runner``), so it is rebuilt whenever one of them changes.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from agent.catalog import Candidate, reference_candidate
from agent.deploy.slots import ActiveModel, Slots
from agent.guard import CrashLoopGuard
from agent.hardware import Hardware
from agent.measure import Status
from agent.measure_child import measure_in_child
from agent.pipeline_runner import PipelineRunner
from agent.selection import Selection, measure_backends, save_selection, select_backend
from agent.serving import ModelRegistry, PublishedModel
from agent.shadow import Agreement, measure_agreement, shadow_inputs
from agent.timing import Budget
from edgecore.backends import Runner
from edgecore.errors import NotFoundError
from edgecore.protocol.golden import load_golden
from edgecore.protocol.manifest import Manifest
from edgecore.tensors import model_precision

__all__ = ["LoadedModel", "LoadedPipeline", "ModelHost", "trial_backend"]

TRIAL_BUDGET_S = 0.05  # a trial checks that a backend loads, answers and closes; its timing is not used

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadedModel:
    active: ActiveModel
    manifest: Manifest
    selection: Selection
    runner: Runner

    @property
    def backend(self) -> str:
        return self.selection.backend

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.active.name, "version": self.active.version, "slot": self.active.slot,
            "artifact_id": self.manifest.artifact_id, "backend": self.selection.backend, "kind": "model",
        }


@dataclass(frozen=True)
class LoadedPipeline:
    active: ActiveModel
    manifest: Manifest
    runner: PipelineRunner

    @property
    def backend(self) -> str:
        return self.runner.name

    def summary(self) -> dict[str, Any]:
        return {"name": self.active.name, "version": self.active.version, "slot": self.active.slot,
                "artifact_id": self.manifest.artifact_id, "backend": self.runner.name, "kind": "pipeline",
                "models": self.runner.versions()}


Served = LoadedModel | LoadedPipeline


class ModelHost:
    """Keeps the models and pipelines the slot pointer names published in the registry, each under its own name."""

    def __init__(self, slots: Slots, registry: ModelRegistry, hardware: Hardware, cache_dir: Path, budget_s: float,
                 guard: CrashLoopGuard | None = None) -> None:
        self.slots = slots
        self.guard = guard  # counts the deaths of this process while it loads and measures a model
        self.registry = registry
        self.hardware = hardware
        self.cache_dir = cache_dir
        self.budget_s = budget_s
        self._lock = threading.Lock()
        self.models: dict[str, LoadedModel] = {}
        self.pipelines: dict[str, LoadedPipeline] = {}

    def served(self) -> dict[str, Served]:
        """Every model and pipeline published now, by name."""
        with self._lock:
            return {**self.models, **self.pipelines}

    def loaded(self, name: str) -> LoadedModel | None:
        with self._lock:
            return self.models.get(name)

    def manifest_of(self, active: ActiveModel) -> Manifest:
        return Manifest.from_bytes((self.slots.dir(active.slot) / "manifest.json").read_bytes())

    def golden_of(self, active: ActiveModel, manifest: Manifest) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        if manifest.golden is None:
            return {}, {}
        return load_golden(self.slots.dir(active.slot) / manifest.golden)

    # -- models -----------------------------------------------------------------------------------

    def load(self, active: ActiveModel, remeasure: bool = False, deployment_id: str | None = None) -> LoadedModel:
        """Choose a backend for ``active`` (cached by model, hardware and runtimes) and publish it under its name.

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
            self.registry.publish(active.name, str(active.version), runner, loaded.summary())
            self.models[active.name] = loaded
        log.info("serving %s v%d on %s", active.name, active.version, selection.backend)
        return loaded

    def remeasure(self, loaded: LoadedModel, budget_s: float, keep_going: Callable[[], bool], nice: int) -> Selection:
        """Measure the backends of the model ``loaded`` serves again, in a child at priority ``nice`` (not cached).

        ``keep_going`` turning false stops the child (``agent.measure_child.Stopped``)."""
        inputs, expected = self.golden_of(loaded.active, loaded.manifest)
        return measure_backends(
            self.slots.dir(loaded.active.slot) / loaded.manifest.model, hardware=self.hardware,
            allowed_providers=list(loaded.manifest.target.execution_providers) or None, golden=inputs or None,
            expected=expected or None, time_budget_s=budget_s, keep_going=keep_going, nice=nice,
        )

    def switch(self, loaded: LoadedModel, selection: Selection, min_agreement: float) -> tuple[bool, Agreement]:
        """Serve ``loaded``'s model on ``selection``'s backend if it answers as the serving one does (the shadow path).

        The new runner answers the golden and the latest live inputs beside the serving one
        (``agent.shadow``); with less than ``min_agreement`` of the samples alike it is closed and
        nothing changes. Otherwise it is published (in-flight requests end on the old runner), the
        pipelines that run the model are rebuilt over it, and ``selection`` is cached. Returns
        whether it switched, and the agreement."""
        runner = selection.open()
        try:
            runner.activate()
            golden = self.golden_of(loaded.active, loaded.manifest)[0]
            feeds, live = shadow_inputs(golden, self.registry.recent_inputs(loaded.active.name), runner.inputs)
            agreement = measure_agreement(lambda feed: self._served(loaded.active.name, feed),
                                          lambda feed: dict(runner.infer(feed)), feeds, live, precision=selection.precision)
        except BaseException:
            runner.close()
            raise
        if agreement.agreement < min_agreement:
            runner.close()
            return False, agreement
        switched = LoadedModel(loaded.active, loaded.manifest, selection, runner)
        with self._lock:
            self.registry.publish(loaded.active.name, str(loaded.active.version), runner, switched.summary())
            self.models[loaded.active.name] = switched
        save_selection(self.cache_dir, selection)
        log.info("serving %s v%d on %s now (was %s)", loaded.active.name, loaded.active.version, selection.backend,
                 loaded.selection.backend)
        for pipeline in self.dependents(loaded.active.name):
            self.load_pipeline(pipeline.active)
        return True, agreement

    def _served(self, name: str, feed: dict[str, np.ndarray]) -> dict[str, Any]:
        with self.registry.acquire(name) as entry:
            return dict(entry.runner.infer(feed))

    def shadow(self, name: str, slot_dir: Path, manifest: Manifest) -> Agreement | None:
        """Run the staged model in ``slot_dir`` beside the one served as ``name``, on the backend serving it now if it
        passes the new model in a child process, else on the reference device (``trial_backend``); None when
        nothing serves ``name``."""
        current = self.loaded(name)
        if current is None:
            return None
        model = slot_dir / manifest.model
        golden = load_golden(slot_dir / manifest.golden)[0] if manifest.golden else {}
        precision = model_precision(model)  # the new model's tolerance, not fp32's
        candidate = trial_backend(current.selection.candidate, model, golden or None, precision)
        with candidate.open(model) as new:
            feeds, live = shadow_inputs(golden, self.registry.recent_inputs(name), new.inputs)
            agreement = measure_agreement(lambda feed: self._served(name, feed), lambda feed: dict(new.infer(feed)),
                                          feeds, live, precision=precision)
        return replace(agreement, backend=candidate.name)

    # -- pipelines --------------------------------------------------------------------------------

    def load_pipeline(self, active: ActiveModel) -> LoadedPipeline:
        """Publish the pipeline ``active`` over the models published now (held until it is replaced or unloaded)."""
        manifest = self.manifest_of(active)
        spec = manifest.pipeline
        assert spec is not None  # the pointer names a pipeline only for a pipeline package
        members: dict[str, PublishedModel] = {}
        try:
            for name in spec.models:
                members[name] = self.registry.hold(name)
        except NotFoundError:
            for entry in members.values():
                self.registry.release(entry)
            raise
        runner = PipelineRunner(manifest, self.slots.dir(active.slot), members, self.registry.release)
        loaded = LoadedPipeline(active, manifest, runner)
        runner.activate()  # a runner that fails to activate has released what it held (PipelineRunner.activate_impl)
        with self._lock:
            self.registry.publish(active.name, str(active.version), runner, loaded.summary())
            self.pipelines[active.name] = loaded
        log.info("serving pipeline %s v%d over %s", active.name, active.version,
                 ", ".join(f"{n} v{v}" for n, v in runner.versions().items()))
        return loaded

    def dependents(self, model: str) -> list[LoadedPipeline]:
        """The pipelines published now whose steps run ``model``."""
        with self._lock:
            return [p for p in self.pipelines.values() if model in p.runner.spec.models]

    # -- unloading --------------------------------------------------------------------------------

    def unload(self, name: str) -> PublishedModel | None:
        """Stop serving ``name``; returns its retired entry (``drained`` once its requests and pipelines let go)."""
        with self._lock:
            self.models.pop(name, None)
            self.pipelines.pop(name, None)
            try:
                return self.registry.unpublish(name)
            except NotFoundError:
                return None

    def unload_all(self) -> None:
        """Stop serving everything: pipelines first, then the models they hold."""
        for name in [*self.pipelines, *self.models]:
            self.unload(name)


def trial_backend(candidate: Candidate, model: Path, golden: dict[str, np.ndarray] | None, precision: str) -> Candidate:
    """``candidate`` if it loads, answers right and closes on ``model`` in a child process, else the reference device.

    The first load of a runtime on a new model may crash it (OpenVINO aborts on string models):
    that must happen in a child. The reference device is the one staging already ran the model on."""
    reference = reference_candidate()
    if candidate == reference:
        return candidate
    trial = measure_in_child(model, [candidate], golden, None, precision, Budget(TRIAL_BUDGET_S))
    if trial.figures[0].status is Status.OK:
        return candidate
    log.warning("%s: %s failed a trial (%s); the reference device runs it instead", model.name, candidate.name,
                trial.figures[0].reason)
    return reference
