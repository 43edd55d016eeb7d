"""What each update state does. Every handler returns an Event; failure handlers never raise."""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agent.config import DeploySettings
from agent.deploy.download import Download, remove_download
from agent.deploy.ledger import Ledger
from agent.deploy.machine import Deployment, Event, Handler, Outcome, State
from agent.deploy.slots import ActiveModel, Slots
from agent.deploy.stage import stage_in_child
from agent.errors import EdgeError
from agent.model_host import ModelHost
from agent.protocol.manifest import manifest_sha256
from agent.protocol.package import extract_payload
from agent.tensors import synthetic_feeds

__all__ = ["Steps", "check_acceptable"]

log = logging.getLogger(__name__)


def check_acceptable(deployment: Deployment, ledger: Ledger, device_target: str | None, allow_downgrade: bool) -> str | None:
    """Why this manifest must not be installed here, or None: expiry, target, version."""
    manifest = deployment.manifest
    if time.time() > manifest.expires_at:
        return f"manifest of {manifest.name} v{manifest.version} has expired"
    if not manifest.target.accepts(device_target):
        return f"package is for target {manifest.target.name!r}, this device is {device_target!r}"
    last = ledger.version(manifest.name)
    if manifest.version < last and not allow_downgrade:
        return f"version {manifest.version} of {manifest.name} is older than the accepted {last}"
    return None


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
        log.warning("deployment %s: %s", deployment.deployment_id, reason)
        return Event.FAILURE

    def _new_model(self, deployment: Deployment) -> ActiveModel:
        m = deployment.manifest
        return ActiveModel(_slot(deployment), m.name, m.version, manifest_sha256(deployment.manifest_bytes))

    # -- states -----------------------------------------------------------------------------------

    def download(self, deployment: Deployment) -> Event:
        problem = check_acceptable(deployment, self.ledger, self.device_target, deployment.options.allow_downgrade)
        if problem:
            return self._fail(deployment, problem)
        try:
            self.fetch(Download(self.downloads, deployment.manifest.payload,
                                quota_bytes=self.settings.download_quota_bytes))
        except EdgeError as exc:
            return self._fail(deployment, f"download: {exc}")
        return Event.SUCCESS

    def verify(self, deployment: Deployment) -> Event:
        manifest = deployment.manifest
        problem = check_acceptable(deployment, self.ledger, self.device_target, deployment.options.allow_downgrade)
        if problem:
            return self._fail(deployment, problem)
        payload = Download(self.downloads, manifest.payload).finish()
        try:
            target = self.slots.prepare_spare()
            deployment.learn(slot=target.name)
            extract_payload(payload, manifest, target)
            (target / "manifest.json").write_bytes(deployment.manifest_bytes)
        except EdgeError as exc:
            return self._fail(deployment, f"verify: {exc}")
        except OSError as exc:  # a full disk, most likely: FAILURE removes what was unpacked
            return self._fail(deployment, f"verify: cannot unpack the payload: {exc.strerror or exc}")
        return Event.SUCCESS

    def stage(self, deployment: Deployment) -> Event:
        result = stage_in_child(
            self.slots.dir(_slot(deployment)), self.settings.stage_timeout_s, self.settings.stage_memory_mb
        )
        deployment.learn(stage=result.detail)
        return Event.SUCCESS if result.ok else self._fail(deployment, f"stage: {result.detail}")

    def shadow(self, deployment: Deployment) -> Event:
        """When the desired state asks: the new model answers beside the serving one; too little agreement fails."""
        wanted = deployment.options.shadow_min
        if wanted is None:
            return Event.SUCCESS
        if self.host.current is None:
            deployment.learn(shadow={"agreement": None, "detail": "no model is serving: nothing to compare with"})
            return Event.SUCCESS
        try:
            result = self.host.shadow(self.slots.dir(_slot(deployment)), deployment.manifest)
        except Exception as exc:  # whatever the candidate does on real inputs is its failure, not the agent's
            return self._fail(deployment, f"shadow: the new model failed beside the serving one: {_first_line(exc)}")
        deployment.learn(shadow={**result.to_dict(), "min_agreement": wanted})
        if result.agreement < wanted:
            return self._fail(deployment, f"shadow: the new model agrees with the serving one on {result.agreement:.1%} of"
                                          f" {result.samples} inputs, {wanted:.1%} needed ({result.first_difference})")
        return Event.SUCCESS

    def activate(self, deployment: Deployment) -> Event:
        model = self._new_model(deployment)
        try:
            self.slots.activate(model)
        except OSError as exc:
            return self._fail(deployment, f"activate: cannot switch the slot pointer: {exc.strerror or exc}")
        try:
            loaded = self.host.load(model, deployment_id=deployment.deployment_id)
        except EdgeError as exc:
            return self._fail(deployment, f"activate: {exc}")
        deployment.learn(backend=loaded.selection.backend, selection=loaded.selection.to_dict())
        return Event.SUCCESS

    def health(self, deployment: Deployment) -> Event:
        loaded = self.host.current
        if loaded is None:
            return self._fail(deployment, "health: no model is being served")
        inputs, _ = self.host.golden_of(loaded.active, loaded.manifest)
        bound = loaded.manifest.health.get("max_latency_ms") or self.settings.health_max_latency_ms
        runs = int(loaded.manifest.health.get("runs") or self.settings.health_runs)
        try:
            latencies = _health_runs(self.host, inputs, runs)
        except Exception as exc:  # anything the model does on real inputs is a health failure
            return self._fail(deployment, f"health: inference failed: {_first_line(exc)}")
        if latencies is None:
            return self._fail(deployment, "health: the model produced NaN or infinite outputs")
        p95 = float(np.percentile(latencies, 95))
        deployment.learn(health_p95_ms=round(p95, 3))
        if bound is not None and p95 > float(bound):
            return self._fail(deployment, f"health: p95 latency {p95:.2f} ms exceeds the bound of {float(bound):.2f} ms")
        return Event.SUCCESS

    def commit(self, deployment: Deployment) -> Event:
        manifest = deployment.manifest
        try:
            self.ledger.commit_version(manifest.name, manifest.version)
        except EdgeError as exc:
            return self._fail(deployment, f"commit: {exc}")
        remove_download(self.downloads, manifest.payload)
        deployment.outcome = Outcome.OK
        deployment.reason = f"{manifest.name} v{manifest.version} committed"
        return Event.SUCCESS

    def rollback(self, deployment: Deployment) -> Event:
        """Put the previous model back; keep going whatever fails, a half rollback bricks devices."""
        deployment.outcome = Outcome.ROLLED_BACK
        remove_download(self.downloads, deployment.manifest.payload)  # first: on a full disk the pointer needs the room
        event = Event.SUCCESS
        committed = self.slots.active()
        try:
            if deployment.findings.slot is not None and committed == self._new_model(deployment):
                committed = self.slots.previous()
                self.slots.roll_back()
        except Exception as exc:  # serve the committed model all the same; the pointer is put back on restart
            log.exception("rollback of %s could not move the slot pointer", deployment.deployment_id)
            deployment.reason = f"{deployment.reason}; rollback could not save the slot pointer: {_first_line(exc)}"
            event = Event.FAILURE
        try:
            if committed is None:
                self.host.unload()
            elif self.host.current is None or self.host.current.active != committed:
                self.host.load(committed)
        except Exception:
            log.exception("rollback of %s did not complete", deployment.deployment_id)
            event = Event.FAILURE
        finally:
            self._cleanup(deployment)
        return event

    def restore_committed(self, deployment: Deployment) -> bool:
        """Before a restarted agent serves: point back at the committed model if ``deployment`` may have switched away.

        A resumed deployment in ROLLBACK (saved in ACTIVATE, HEALTH or ROLLBACK, or unknown) may have
        left the pointer on its new, uncommitted model. Returns False when that could not be undone
        (then nothing must be served until the rollback state runs)."""
        if deployment.state is not State.ROLLBACK or deployment.findings.slot is None:
            return True
        try:
            if self.slots.active() == self._new_model(deployment):
                self.slots.roll_back()
                log.info("deployment %s: back on the committed model before serving", deployment.deployment_id)
        except Exception:
            log.exception("cannot restore the committed model for %s", deployment.deployment_id)
            return False
        return True

    def failure(self, deployment: Deployment) -> Event:
        """Clean up a deployment that never touched the active model."""
        deployment.outcome = deployment.outcome or Outcome.FAILED
        self._cleanup(deployment)
        return Event.SUCCESS

    def _cleanup(self, deployment: Deployment) -> None:
        try:
            remove_download(self.downloads, deployment.manifest.payload)
            slot = deployment.findings.slot
            active = self.slots.active()
            if slot and (active is None or active.slot != slot):
                shutil.rmtree(self.slots.dir(slot), ignore_errors=True)
        except Exception:
            log.exception("cleanup of %s did not complete", deployment.deployment_id)


def _slot(deployment: Deployment) -> str:
    """The slot VERIFY unpacked into (the states after it run only once it is known)."""
    slot = deployment.findings.slot
    if slot is None:
        raise RuntimeError(f"deployment {deployment.deployment_id} in {deployment.state.value} has no slot")
    return slot


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _health_runs(host: ModelHost, golden: dict[str, np.ndarray], runs: int) -> list[float] | None:
    """Latencies in ms of ``runs`` inferences through the served runner; None on NaN/inf outputs."""
    loaded = host.current
    assert loaded is not None
    runner = loaded.runner
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
