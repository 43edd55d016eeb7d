"""A ModelHost serving a packaged model from a real slot, as the agent does after a deployment (for tests)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agent.catalog import Candidate
from agent.deploy.slots import ActiveModel, Slots
from agent.hardware import probe_hardware
from agent.model_host import ModelHost
from agent.selection import save_selection
from agent.serving import ModelRegistry
from edgecore.protocol.envelope import TrustedKeys
from edgecore.protocol.manifest import Manifest, manifest_sha256
from edgecore.protocol.package import extract_payload
from edgectl.package import BuildOptions, build_package, read_package

__all__ = ["install", "serving_host"]

KEY = Ed25519PrivateKey.generate()


def install(model: Path, name: str, version: int, slots: Slots, workdir: Path) -> tuple[ActiveModel, Manifest]:
    """Package ``model`` as ``edgectl build`` does, and unpack it into the spare slot as VERIFY does."""
    built = workdir / f"{name}-{version}.edgepkg"
    build_package(model, BuildOptions(name, version), KEY, built)
    opened = workdir / f"open-{name}-{version}"
    opened.mkdir()
    package = read_package(built, TrustedKeys([KEY.public_key()]), opened)
    slot = slots.spare(name)
    extract_payload(package.payload, package.manifest, slots.prepare_spare(name))
    manifest_bytes = package.manifest.to_bytes()
    (slots.dir(slot) / "manifest.json").write_bytes(manifest_bytes)
    return ActiveModel(slot, name, version, manifest_sha256(manifest_bytes)), package.manifest


def serving_host(model: Path, workdir: Path, stale: Candidate | None = None) -> ModelHost:
    """A host serving ``model`` (name "m", version 1); with ``stale``, on that backend, cached as a pick by the estimate."""
    slots = Slots(workdir / "state")
    active, _ = install(model, "m", 1, slots, workdir)
    slots.activate(active)
    host = ModelHost(slots, ModelRegistry(), probe_hardware(), workdir / "state" / "selection", budget_s=0.5)
    fresh = host.load(active).selection
    if stale is None or fresh.decision is None:
        return host
    decision = dataclasses.replace(fresh.decision, winner=stale.name, runner_up=fresh.backend, rule="estimate")
    figures = tuple(dataclasses.replace(f, chosen=f.candidate == stale) for f in fresh.figures)
    save_selection(host.cache_dir, dataclasses.replace(fresh, candidate=stale, figures=figures, decision=decision))
    assert host.load(active).selection.backend == stale.name
    return host
