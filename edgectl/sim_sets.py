"""How a light simulated agent applies a desired set: admission, one deployment per changed entry, removal, rollback.

The device side of docs/protocol.md ("How a device applies a set", "Admission") with the model's
execution simulated: before anything changes, the set's footprints (what the agent measured of a
model it serves, else the size of its model files) must fit the agent's memory budget, or the set is
refused with an ``admission``/``failed`` event under the set's id and each changed entry's; then
each model the set no longer names is removed (``remove``/``ok``), and each entry that differs from
what is served is deployed under its own deployment id (download with hash checks, extraction,
shadow run, health check), one after another. A newer set stops an older one between entries.
The figures a deployment measures are simulated (:class:`edgectl.sim.SimAgent`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgecore import __version__
from edgecore.admission import Cost, admit
from edgecore.delivery.download import Download
from edgecore.delivery.sources import ArtifactFetcher
from edgecore.errors import EdgeError
from edgecore.protocol.golden import load_golden
from edgecore.protocol.intake import SetOrder, Verified, refusal
from edgecore.protocol.ledger import Ledger
from edgecore.protocol.manifest import Manifest
from edgecore.protocol.package import extract_payload
from edgecore.protocol.reports import RunningModel

__all__ = ["MIB", "Measured", "Served", "SetRunner", "weights_mb"]

MIB = float(1 << 20)
WEIGHT_ROLES = ("model", "partition", "graph")
# numpy parses .npz headers with ast.literal_eval, which CPython 3.11 can break when several threads
# build ASTs at once ("AST constructor recursion depth mismatch", gh-106905): one at a time.
_GOLDEN_LOCK = threading.Lock()

Event = Callable[[str, str, str, str, "dict[str, Any] | None", "str | None"], None]  # id, state, status, detail, data, model


def weights_mb(manifest: Manifest) -> float:
    """The size of the files a model must hold in memory: what admission counts before the model is measured."""
    return sum(f.size for f in manifest.files if f.role in WEIGHT_ROLES) / MIB


@dataclass(frozen=True)
class Measured:
    """A model as it runs on a light agent once installed (simulated): its backend, footprint and p95 latency."""

    backend: str
    footprint_mb: float
    p95_ms: float


@dataclass
class Served:
    """What one light agent serves: by name, with the model each one replaced (for a rollback command)."""

    models: dict[str, RunningModel] = field(default_factory=dict)
    previous: dict[str, RunningModel | None] = field(default_factory=dict)
    one_slot: bool = False  # an agent from before sets: one model, which a new one replaces whatever its name
    latest_seq: int = 0  # the newest set accepted: an older one still applying stops between entries
    deploying: str | None = None  # the deployment under way (the state reports it)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def runs(self, manifest: Manifest) -> bool:
        m = self.models.get(manifest.name)
        return m is not None and (m.version, m.artifact_id) == (manifest.version, manifest.artifact_id)

    def roll_back(self, deployment_id: str, model: str | None) -> str | None:
        """Put back what the deployment (or ``model``'s last one) replaced; the name rolled back, or None."""
        name = model or next((n for n, m in self.models.items() if m.deployment_id == deployment_id), None)
        if name is None and len(self.models) == 1:  # an agent from before sets: its one model
            name = next(iter(self.models))
        if name is None or name not in self.models:
            return None
        back = self.previous.pop(name, None)
        del self.models[name]
        if back is not None:
            self.models[back.name] = back
        return name

    def install(self, model: RunningModel) -> None:
        """Serve ``model``, keeping what it replaces for a rollback (an agent from before sets replaces its one model)."""
        replaced = next(iter(self.models.values()), None) if self.one_slot else self.models.get(model.name)
        if self.one_slot:
            self.models.clear()
            self.previous.clear()
        self.previous[model.name] = replaced
        self.models[model.name] = model


@dataclass
class SetRunner:
    """Applies sets for one light agent (the simulated parts are the agent's ``measure`` and ``shadow``)."""

    served: Served
    ledger: Ledger
    fetcher: ArtifactFetcher
    state_dir: Path
    target: str
    budget_mb: float | None
    event: Event
    measure: Callable[[Manifest], Measured]
    shadow: Callable[[Manifest, float], tuple[dict[str, Any], str | None]]  # a shadow run: its report, why it refuses

    def apply(self, order: SetOrder) -> None:
        """Admission, removals, then each changed entry's deployment, in the set's order."""
        with self.served.lock:
            if order.desired.seq < self.served.latest_seq:
                return  # a newer set came while this one waited: it supersedes it
            changed = [v for v in order.entries if not self.served.runs(v.manifest)]
            refused = self.admission(order, changed)
            if refused:
                for deployment_id, model in [(order.desired.deployment_id, None), *((v.entry.deployment_id, v.entry.name)
                                                                                    for v in changed)]:
                    self.event(deployment_id, "admission", "failed", refused[0], refused[1], model)
                return
            for name in [n for n in self.served.models if order.desired.entry(n) is None and not self.served.one_slot]:
                del self.served.models[name]
                self.served.previous.pop(name, None)
                self.event(order.desired.deployment_id, "remove", "ok", f"{name} removed", {}, name)
            for verified in changed:
                if order.desired.seq < self.served.latest_seq:
                    return
                self.served.deploying = verified.entry.deployment_id
                try:
                    self.deploy(verified)
                finally:
                    self.served.deploying = None

    def admission(self, order: SetOrder, changed: list[Verified]) -> tuple[str, dict[str, Any]] | None:
        """Why the set does not fit the budget, with its numbers; None when it does (or there is no budget)."""
        refused = admit((self._cost(v, v not in changed) for v in order.entries), self.budget_mb)
        return None if refused is None else (refused.detail(), refused.data())

    def _cost(self, verified: Verified, unchanged: bool) -> Cost:
        """What a model counts: the footprint simulated for it when it is served unchanged, else its weights' size."""
        name = verified.manifest.name
        served = self.served.models.get(name)
        if unchanged and served is not None and served.footprint_mb is not None:
            return Cost(name, served.footprint_mb, "as served (simulated)")
        return Cost(name, weights_mb(verified.manifest), "its files' size, not measured yet")

    def deploy(self, verified: Verified) -> None:
        """One entry's deployment, reported under its own deployment id and name."""
        entry, manifest = verified.entry, verified.manifest
        did, name = entry.deployment_id, entry.name
        data: dict[str, Any] = {"model": name, "version": manifest.version}
        try:
            problem = refusal(manifest, self.ledger, self.target, entry.options.allow_downgrade, __version__)
            if problem:
                return self.event(did, "done", "failed", problem, data, name)
            self.event(did, "download", "running", "", data, name)
            download = Download(self.state_dir / "downloads", manifest.payload)
            self.fetcher.fetch(download)
            self.event(did, "verify", "running", "", data, name)
            slot = self.state_dir / "slots" / manifest.artifact_id[:16]
            extract_payload(download.finish(), manifest, slot)
            download.discard()
            if entry.options.shadow_min is not None and name in self.served.models:
                data["shadow"], refused = self.shadow(manifest, entry.options.shadow_min)
                self.event(did, "shadow", "running", "", data, name)
                if refused:
                    return self.event(did, "done", "failed", refused, data, name)
            self.event(did, "health", "running", "", data, name)
            if not _healthy(slot, manifest):
                return self.event(did, "done", "rolled-back", "health: the model produced NaN or infinite outputs", data,
                                  name)
            running = self.measure(manifest)
            self.served.install(RunningModel(name, manifest.version, manifest.artifact_id, running.backend, slot.name,
                                             manifest.kind, did, running.footprint_mb, {running.backend: running.footprint_mb}))
            self.ledger.commit_version(name, manifest.version)
            data.update(backend=running.backend, health_p95_ms=running.p95_ms)
            self.event(did, "done", "ok", f"{name} v{manifest.version} committed", data, name)
        except EdgeError as exc:
            self.event(did, "done", "failed", str(exc), data, name)


def _healthy(slot: Path, manifest: Manifest) -> bool:
    """The simulated health check: the package's golden outputs hold no NaN or infinity."""
    with _GOLDEN_LOCK:
        _, outputs = load_golden(slot / manifest.golden) if manifest.golden else ({}, {})
    return not any(np.asarray(v).dtype.kind == "f" and not np.all(np.isfinite(v)) for v in outputs.values())
