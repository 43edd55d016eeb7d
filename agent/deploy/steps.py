"""What each update state does, for every part of a deployment's unit. Every handler returns an Event; failure
handlers never raise.

A unit is a model alone, or a pipeline with the models its steps run (``agent.deploy.record``).
Its parts are downloaded, verified, staged and shadowed one by one, then activated by one write of
the slot pointer, so a power cut leaves all of them switched or none; a failure anywhere rolls all
of them back. Other models are never touched, so their requests go on.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agent import __version__
from agent.config import DeploySettings
from agent.deploy.machine import Deployment, Event, Handler, Outcome, State
from agent.deploy.record import Part
from agent.deploy.slots import ActiveModel, Slots
from agent.deploy.stage import stage_in_child
from agent.footprint import FootprintBook, footprint_key, footprint_mb
from agent.model_host import LoadedModel, ModelHost
from edgecore.backends import Runner
from edgecore.delivery.download import Download, remove_download
from edgecore.errors import EdgeError
from edgecore.protocol.intake import refusal
from edgecore.protocol.ledger import Ledger
from edgecore.protocol.manifest import manifest_sha256
from edgecore.protocol.package import extract_payload
from edgecore.tensors import synthetic_feeds

__all__ = ["Steps", "check_acceptable"]

log = logging.getLogger(__name__)

# Called once a unit's new parts are staged (their footprints measured): why the set no longer fits, or None.
Admission = Callable[[Deployment], str | None]


def check_acceptable(part: Part, ledger: Ledger, device_target: str | None) -> str | None:
    """Why this part's manifest must not be installed here, or None: expiry, agent version, target, version."""
    return refusal(part.manifest, ledger, device_target, part.options.allow_downgrade, __version__)


@dataclass
class Steps:
    """The handlers of the update states, bound to this device's services."""

    settings: DeploySettings
    state_dir: Path
    slots: Slots
    ledger: Ledger
    host: ModelHost
    fetch: Callable[[Download], None]  # blocks until the download completes or raises
    device_target: str | None
    book: FootprintBook | None = None  # where measured footprints are kept (None: not kept)
    admission: Admission | None = None  # the set's admission, asked again after staging (None: not asked)

    @property
    def downloads(self) -> Path:
        return self.state_dir / "downloads"

    def handlers(self) -> Mapping[State, Handler]:
        return {
            State.DOWNLOAD: self.download, State.VERIFY: self.verify, State.STAGE: self.stage, State.SHADOW: self.shadow,
            State.ACTIVATE: self.activate, State.HEALTH: self.health, State.COMMIT: self.commit,
            State.ROLLBACK: self.rollback, State.FAILURE: self.failure,
        }

    def _fail(self, deployment: Deployment, reason: str) -> Event:
        deployment.reason = reason
        log.warning("deployment %s (%s): %s", deployment.deployment_id, deployment.unit, reason)
        return Event.FAILURE

    def new_model(self, part: Part) -> ActiveModel:
        m = part.manifest
        return ActiveModel(_slot(part), m.name, m.version, manifest_sha256(part.manifest_bytes), m.kind, part.deployment_id)

    # -- states -----------------------------------------------------------------------------------

    def download(self, deployment: Deployment) -> Event:
        for part in deployment.parts:
            problem = check_acceptable(part, self.ledger, self.device_target)
            if problem:
                return self._fail(deployment, problem)
        for part in deployment.parts:
            try:
                self.fetch(Download(self.downloads, part.manifest.payload, quota_bytes=self.settings.download_quota_bytes))
            except EdgeError as exc:
                return self._fail(deployment, f"download: {_named(deployment, part)}{exc}")
        return Event.SUCCESS

    def verify(self, deployment: Deployment) -> Event:
        for part in deployment.parts:
            problem = check_acceptable(part, self.ledger, self.device_target)
            if problem:
                return self._fail(deployment, problem)
            manifest = part.manifest
            payload = Download(self.downloads, manifest.payload).finish()
            try:
                target = self.slots.prepare_spare(part.name)
                part.learn(slot=f"{part.name}/{target.name}")
                extract_payload(payload, manifest, target)
                (target / "manifest.json").write_bytes(part.manifest_bytes)
            except EdgeError as exc:
                return self._fail(deployment, f"verify: {_named(deployment, part)}{exc}")
            except OSError as exc:  # a full disk, most likely: FAILURE removes what was unpacked
                return self._fail(deployment, f"verify: {_named(deployment, part)}cannot unpack the payload: "
                                              f"{exc.strerror or exc}")
        return Event.SUCCESS

    def stage(self, deployment: Deployment) -> Event:
        """Each model in a limited child (its footprint measured there), then each pipeline with its models."""
        for part in sorted(deployment.parts, key=lambda p: p.manifest.is_pipeline):
            members = self._members(deployment, part) if part.manifest.is_pipeline else None
            result = stage_in_child(self.slots.dir(_slot(part)), self.settings.stage_timeout_s,
                                    self.settings.stage_memory_mb, members)
            footprints = {result.backend: result.footprint_mb} if result.backend and result.footprint_mb is not None else {}
            part.learn(stage=result.detail, footprints=footprints or None)
            if not result.ok:
                return self._fail(deployment, f"stage: {_named(deployment, part)}{result.detail}")
            if self.book is not None and footprints:
                self.book.record(footprint_key(part.manifest), footprints)
        problem = self.admission(deployment) if self.admission is not None else None
        return self._fail(deployment, f"admission: {problem}") if problem else Event.SUCCESS

    def _members(self, deployment: Deployment, pipeline: Part) -> dict[str, Path]:
        """The slot of each model ``pipeline`` runs: its new version in this unit, else the one active now."""
        spec = pipeline.manifest.pipeline
        assert spec is not None  # a pipeline part's manifest always has its steps
        new = {part.name: self.slots.dir(_slot(part)) for part in deployment.parts if not part.manifest.is_pipeline}
        members = {}
        for name in spec.models:
            active = self.slots.active(name)
            if name in new:
                members[name] = new[name]
            elif active is not None:
                members[name] = self.slots.dir(active.slot)
        return members

    def shadow(self, deployment: Deployment) -> Event:
        """When the desired state asks: each new model answers beside the one serving its name; too little agreement fails.

        A pipeline that asks for a shadow run asks it of the models of its unit (a pipeline's own
        answer is its models' answers through its graphs)."""
        unit_wants = [p.options.shadow_min for p in deployment.parts if p.manifest.is_pipeline and p.options.shadow_min]
        for part in deployment.parts:
            wanted = part.options.shadow_min if part.options.shadow_min is not None else max(unit_wants, default=None)
            if wanted is None or part.manifest.is_pipeline:
                continue
            try:
                result = self.host.shadow(part.name, self.slots.dir(_slot(part)), part.manifest)
            except Exception as exc:  # whatever the candidate does on real inputs is its failure, not the agent's
                return self._fail(deployment, f"shadow: {_named(deployment, part)}the new model failed beside the serving "
                                              f"one: {_first_line(exc)}")
            if result is None:
                part.learn(shadow={"agreement": None, "detail": "no model is serving: nothing to compare with"})
                continue
            part.learn(shadow={**result.to_dict(), "min_agreement": wanted})
            if result.agreement < wanted:
                return self._fail(deployment, f"shadow: {_named(deployment, part)}the new model agrees with the serving "
                                              f"one on {result.agreement:.1%} of {result.samples} inputs, {wanted:.1%} "
                                              f"needed ({result.first_difference})")
        return Event.SUCCESS

    def activate(self, deployment: Deployment) -> Event:
        """One write of the pointer switches every part; then the models load, then the pipelines over them."""
        models = [self.new_model(part) for part in deployment.parts]
        try:
            self.slots.activate(*models)
        except OSError as exc:
            return self._fail(deployment, f"activate: cannot switch the slot pointer: {exc.strerror or exc}")
        try:
            for part, model in zip(deployment.parts, models, strict=True):
                if not part.manifest.is_pipeline:
                    loaded = self.host.load(model, deployment_id=part.deployment_id)
                    part.learn(backend=loaded.selection.backend, selection=loaded.selection.to_dict())
                    self._measure_serving(part, loaded)
            self._load_pipelines(deployment, {m.name: m for m in models if m.kind == "pipeline"})
        except EdgeError as exc:
            return self._fail(deployment, f"activate: {exc}")
        return Event.SUCCESS

    def _measure_serving(self, part: Part, loaded: LoadedModel) -> None:
        """The footprint on the serving backend, when staging measured another (a child, as staging's)."""
        known = dict(part.findings.footprints or {})
        if self.book is None or loaded.selection.backend in known:
            return
        inputs, _ = self.host.golden_of(loaded.active, loaded.manifest)
        mb = footprint_mb(loaded.selection.candidate, self.slots.dir(loaded.active.slot) / loaded.manifest.model,
                          inputs or synthetic_feeds(loaded.runner.inputs))
        if mb is not None:
            known[loaded.selection.backend] = mb
            part.learn(footprints=known)
            self.book.record(footprint_key(part.manifest), {loaded.selection.backend: mb})

    def _load_pipelines(self, deployment: Deployment, pipelines: Mapping[str, ActiveModel]) -> None:
        """Publish the unit's pipelines, and rebuild those outside it whose models it changed."""
        self._rebuild({p.name for p in deployment.parts if not p.manifest.is_pipeline}, pipelines)

    def _rebuild(self, models: set[str], pipelines: Mapping[str, ActiveModel]) -> None:
        for active in pipelines.values():
            self.host.load_pipeline(active)
        for name in sorted(models):
            for pipeline in self.host.dependents(name):
                if pipeline.active.name not in pipelines:
                    self.host.load_pipeline(pipeline.active)

    def serve(self, committed: Mapping[str, ActiveModel | None]) -> None:
        """Serve ``committed`` under each name (None: nothing), and rebuild the pipelines over models that changed."""
        for name in sorted(committed, key=lambda n: n not in self.host.pipelines):  # pipelines before their models
            if committed[name] is None and name in self.host.served():
                self.host.unload(name)
        reloaded = set()
        for name, model in committed.items():
            current = self.host.loaded(name)
            if model is not None and model.kind != "pipeline" and (current is None or current.active != model):
                self.host.load(model)
                reloaded.add(name)
        self._rebuild(reloaded, {n: m for n, m in committed.items() if m is not None and m.kind == "pipeline"})

    def health(self, deployment: Deployment) -> Event:
        for part in deployment.parts:
            served = self.host.served().get(part.name)
            if served is None:
                return self._fail(deployment, f"health: {part.name} is not being served")
            inputs, _ = self.host.golden_of(served.active, served.manifest)
            bound = served.manifest.health.get("max_latency_ms") or self.settings.health_max_latency_ms
            runs = int(served.manifest.health.get("runs") or self.settings.health_runs)
            try:
                latencies = _health_runs(served.runner, inputs, runs)
            except Exception as exc:  # anything the model does on real inputs is a health failure
                return self._fail(deployment, f"health: {_named(deployment, part)}inference failed: {_first_line(exc)}")
            if latencies is None:
                return self._fail(deployment, f"health: {_named(deployment, part)}the model produced NaN or infinite "
                                              "outputs")
            p95 = float(np.percentile(latencies, 95))
            part.learn(health_p95_ms=round(p95, 3))
            if bound is not None and p95 > float(bound):
                return self._fail(deployment, f"health: {_named(deployment, part)}p95 latency {p95:.2f} ms exceeds the "
                                              f"bound of {float(bound):.2f} ms")
        return Event.SUCCESS

    def commit(self, deployment: Deployment) -> Event:
        try:
            for part in deployment.parts:
                self.ledger.commit_version(part.name, part.manifest.version)
        except EdgeError as exc:
            return self._fail(deployment, f"commit: {exc}")
        for part in deployment.parts:
            remove_download(self.downloads, part.manifest.payload)
        deployment.outcome = Outcome.OK
        deployment.reason = ", ".join(f"{p.name} v{p.manifest.version}" for p in deployment.parts) + " committed"
        return Event.SUCCESS

    def rollback(self, deployment: Deployment) -> Event:
        """Put the unit's previous models back, in one write; keep going whatever fails, a half rollback bricks devices."""
        deployment.outcome = Outcome.ROLLED_BACK
        for part in deployment.parts:  # first: on a full disk the pointer needs the room
            remove_download(self.downloads, part.manifest.payload)
        event = Event.SUCCESS
        try:
            self._restore_pointer(deployment)
        except Exception as exc:  # serve the committed models all the same; the pointer is put back on restart
            log.exception("rollback of %s could not move the slot pointer", deployment.deployment_id)
            deployment.reason = f"{deployment.reason}; rollback could not save the slot pointer: {_first_line(exc)}"
            event = Event.FAILURE
        committed = {part.name: self._committed(deployment, part) for part in deployment.parts}
        try:
            self.serve(committed)
        except Exception:
            log.exception("rollback of %s did not complete", deployment.deployment_id)
            event = Event.FAILURE
        finally:
            self._cleanup(deployment)
        return event

    def _committed(self, deployment: Deployment, part: Part) -> ActiveModel | None:
        """What ``part``'s name should serve after the rollback: the pointer's, unless it still names the new model."""
        active = self.slots.active(part.name)
        if self._points_at(part):
            return self.slots.previous(part.name)  # the pointer could not be moved back: serve the previous anyway
        return active

    def _points_at(self, part: Part) -> bool:
        """Whether the pointer names ``part``'s new model (its slot and signed manifest) under its name."""
        active = self.slots.active(part.name)
        return (part.findings.slot is not None and active is not None and active.slot == part.findings.slot
                and active.manifest_sha256 == manifest_sha256(part.manifest_bytes))

    def _restore_pointer(self, deployment: Deployment) -> bool:
        """Point every part that the pointer names with its new model back at its previous one (one write)."""
        moved = [p.name for p in deployment.parts if self._points_at(p)]
        if moved:
            self.slots.roll_back(*moved)
        return bool(moved)

    def restore_committed(self, deployment: Deployment) -> bool:
        """Before a restarted agent serves: point back at the committed models if ``deployment`` may have switched away.

        A resumed deployment in ROLLBACK (saved in ACTIVATE, HEALTH or ROLLBACK, or unknown) may have
        left the pointer on its new, uncommitted models. Returns False when that could not be undone
        (then nothing of the unit must be served until the rollback state runs)."""
        if deployment.state is not State.ROLLBACK:
            return True
        try:
            if self._restore_pointer(deployment):
                log.info("deployment %s: back on the committed models before serving", deployment.deployment_id)
        except Exception:
            log.exception("cannot restore the committed models for %s", deployment.deployment_id)
            return False
        return True

    def failure(self, deployment: Deployment) -> Event:
        """Clean up a deployment that never touched the active models."""
        deployment.outcome = deployment.outcome or Outcome.FAILED
        self._cleanup(deployment)
        return Event.SUCCESS

    def _cleanup(self, deployment: Deployment) -> None:
        for part in deployment.parts:
            try:
                remove_download(self.downloads, part.manifest.payload)
                slot = part.findings.slot
                active = self.slots.active(part.name)
                if slot and (active is None or active.slot != slot):
                    shutil.rmtree(self.slots.dir(slot), ignore_errors=True)
            except Exception:
                log.exception("cleanup of %s (%s) did not complete", deployment.deployment_id, part.name)


def _slot(part: Part) -> str:
    """The slot VERIFY unpacked ``part`` into (the states after it run only once it is known)."""
    slot = part.findings.slot
    if slot is None:
        raise RuntimeError(f"{part.name} of deployment {part.deployment_id} has no slot")
    return slot


def _named(deployment: Deployment, part: Part) -> str:
    """``"name: "`` before a reason when the unit has several parts (one part's reason reads as before)."""
    return f"{part.name}: " if len(deployment.parts) > 1 else ""


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _health_runs(runner: Runner, golden: dict[str, np.ndarray], runs: int) -> list[float] | None:
    """Latencies in ms of ``runs`` inferences through the served runner; None on NaN/inf outputs."""
    feeds = golden or synthetic_feeds(runner.inputs)
    latencies = []
    for _ in range(max(1, runs)):
        start = time.perf_counter()
        outputs = runner.infer(feeds)
        latencies.append((time.perf_counter() - start) * 1000)
        for value in outputs.values():
            arr = np.asarray(value)
            if arr.dtype.kind in "fc" and not np.all(np.isfinite(arr)):
                return None
    return latencies
