"""From a desired set to the work it asks of this device: units to deploy, names to remove, entries unchanged.

A *unit* is what switches together: a pipeline and the models its steps run (pipelines sharing a
model join one unit), or a model no pipeline of the set runs. A unit is deployed when one of its
entries differs from what the device runs under that name (the sha256 of the signed manifest);
only its changed entries are its parts. Names the device runs that the set does not name are
removed, pipelines before models (a model a remaining pipeline runs is never removed: the set's
own check refuses that).
"""

from __future__ import annotations

import base64
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.deploy.record import Options, Part
from agent.deploy.slots import ActiveModel
from edgecore.protocol.manifest import Manifest, manifest_sha256

__all__ = ["Plan", "Wanted", "plan_set"]


@dataclass(frozen=True)
class Wanted:
    """One model or pipeline of an accepted desired set, as the device keeps it until the set is applied."""

    deployment_id: str
    manifest_bytes: bytes
    options: Options = field(default_factory=Options)

    @functools.cached_property
    def manifest(self) -> Manifest:
        return Manifest.from_bytes(self.manifest_bytes)

    @property
    def name(self) -> str:
        return self.manifest.name

    @property
    def sha256(self) -> str:
        return manifest_sha256(self.manifest_bytes)

    def part(self) -> Part:
        return Part(self.deployment_id, self.manifest_bytes, self.options)

    def to_dict(self) -> dict[str, Any]:
        return {"deployment_id": self.deployment_id, "manifest": base64.b64encode(self.manifest_bytes).decode(),
                "options": self.options.to_dict()}

    @classmethod
    def from_dict(cls, data: Any) -> Wanted:
        if not isinstance(data, dict) or not isinstance(data.get("options", {}), dict):
            raise TypeError("a wanted entry must be an object")
        return cls(str(data["deployment_id"]), base64.b64decode(data["manifest"]), Options.from_dict(data.get("options", {})))


@dataclass(frozen=True)
class Plan:
    units: tuple[tuple[Wanted, ...], ...]  # each unit's changed entries: its models (in set order), then its pipelines
    remove_pipelines: tuple[str, ...]
    remove_models: tuple[str, ...]
    unchanged: tuple[Wanted, ...]


def unit_key(unit: Sequence[Wanted]) -> str:
    """A unit's name in a job's progress: its parts' names."""
    return "+".join(w.name for w in unit)


def plan_set(wanted: Sequence[Wanted], actives: Mapping[str, ActiveModel]) -> Plan:
    """What applying ``wanted`` (the whole set) means on a device that runs ``actives``."""
    order = {w.name: i for i, w in enumerate(wanted)}
    group = {w.name: w.name for w in wanted}

    def root(name: str) -> str:
        while group[name] != name:
            name = group[name]
        return name

    for w in wanted:
        for model in (w.manifest.pipeline.models if w.manifest.pipeline else ()):
            if model in group:
                group[root(model)] = root(w.name)
    changed = [w for w in wanted if (a := actives.get(w.name)) is None or a.manifest_sha256 != w.sha256]
    components: dict[str, list[Wanted]] = {}
    for w in changed:
        components.setdefault(root(w.name), []).append(w)
    units = [tuple(sorted(parts, key=lambda w: (w.manifest.is_pipeline, order[w.name]))) for parts in components.values()]
    units.sort(key=lambda unit: min(order[w.name] for w in unit))
    gone = [name for name in actives if name not in order]
    return Plan(tuple(units), tuple(sorted(n for n in gone if actives[n].kind == "pipeline")),
                tuple(sorted(n for n in gone if actives[n].kind != "pipeline")),
                tuple(w for w in wanted if w not in changed))
