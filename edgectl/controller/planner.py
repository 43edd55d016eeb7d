"""Rollout plans: which package variant each device gets, and which wave it is in.

Waves are cumulative sizes: ``1,10%,50%,100%`` over 40 devices gives waves of 1, 3, 16 and 20
devices. Online devices come first so the canary wave is made of devices that can answer; the
last wave always reaches every matching device.

A variant is one signed manifest, keyed by its sha256 (:func:`variant_id`), not by the payload's
artifact id: packages built for several targets from one model often carry byte-identical payloads
(same artifact id, same chunks, sent once on the shared artifact topic) but different manifests,
and each device must get the manifest of its own target.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgecore.errors import UserError
from edgectl.controller.records import PackageRef
from edgectl.package import Package

__all__ = [
    "Plan", "PlannedDevice", "check_variants", "choose_variant", "package_ref", "parse_waves", "plan_rollout", "variant_id",
    "variant_label",
]

# Assumptions for the duration estimate (docs/fleet.md): broker fan-out throughput and the
# agent's verify + stage + activate + health time.
TRANSFER_BYTES_PER_S = 2_000_000
INSTALL_S = 15.0
MINUTE_S = 60.0


@dataclass(frozen=True)
class PlannedDevice:
    device_id: str
    wave: int  # 1-based; 0 when skipped or refused
    variant: str | None  # variant_id of its package
    target: str | None
    reason: str = ""  # why it is skipped or refused; for a device in a wave, a flag (a likely refusal after staging)


# Why a device must not get a package (a refusal), and what to flag about it: (refusal or "", note or "").
Screening = Callable[[dict[str, Any], Package], tuple[str, str]]


@dataclass
class Plan:
    devices: list[PlannedDevice]
    packages: dict[str, Package]  # variant id -> package
    bake_s: float
    waves: int = 0
    skipped: list[PlannedDevice] = field(default_factory=list)
    refused: list[PlannedDevice] = field(default_factory=list)  # the set it would make cannot go to the device
    max_per_minute: int = 0  # pacing (edgectl/controller/pacing.py): desired states sent a minute within a wave

    def wave_devices(self, wave: int) -> list[PlannedDevice]:
        return [d for d in self.devices if d.wave == wave]

    def wave_bytes(self, wave: int) -> int:
        """Bytes the broker sends for a wave: each distinct payload once, fanned out to all.

        A paced wave's devices ask at different times, so each gets its own transfer (at most
        this much: downloads that overlap share chunks)."""
        payloads = [self.packages[d.variant].manifest.payload for d in self.wave_devices(wave) if d.variant]
        return sum(p.size for p in (payloads if self.max_per_minute > 0 else set(payloads)))

    def pacing_s(self, wave: int) -> float:
        """How long pacing takes to send a wave: the first device at once, then one every 60/N s."""
        if self.max_per_minute <= 0:
            return 0.0
        return max(0, len(self.wave_devices(wave)) - 1) * MINUTE_S / self.max_per_minute

    def wave_s(self, wave: int) -> float:
        """Sending (paced), the last device's transfer and install, then the bake."""
        transfer = self.wave_bytes(wave) if self.max_per_minute <= 0 else max(
            (self.packages[d.variant].manifest.payload.size for d in self.wave_devices(wave) if d.variant), default=0)
        return self.pacing_s(wave) + transfer / TRANSFER_BYTES_PER_S + INSTALL_S + self.bake_s

    def estimated_s(self) -> float:
        return sum(self.wave_s(w) for w in range(1, self.waves + 1))

    def to_dict(self) -> dict[str, Any]:
        return {
            "waves": [
                {"wave": w, "devices": [{"device_id": d.device_id, "target": d.target,
                                         "variant": variant_label(self.packages[d.variant]) if d.variant else None,
                                         "note": d.reason}
                                        for d in self.wave_devices(w)],
                 "bytes": self.wave_bytes(w), "pacing_s": round(self.pacing_s(w), 1)}
                for w in range(1, self.waves + 1)
            ],
            "skipped": [{"device_id": d.device_id, "target": d.target, "reason": d.reason} for d in self.skipped],
            "refused": [{"device_id": d.device_id, "target": d.target, "reason": d.reason} for d in self.refused],
            "total_bytes": sum(self.wave_bytes(w) for w in range(1, self.waves + 1)),
            "estimated_s": round(self.estimated_s(), 1),
            "bake_s": self.bake_s,
            "max_per_minute": self.max_per_minute,
        }


def variant_id(package: Package) -> str:
    """sha256 of the signed manifest: what tells two variants apart when their payloads are equal."""
    return hashlib.sha256(package.envelope.payload).hexdigest()


def variant_label(package: Package) -> str:
    m = package.manifest
    return f"{m.name} v{m.version} ({m.target.name})"


WEIGHT_ROLES = ("model", "partition", "graph")  # files a device holds in memory to serve the package


def package_ref(package: Package, kept: Path) -> PackageRef:
    """What a rollout keeps of one variant: the file ``kept`` by the store, what it installs, and what admission counts."""
    m = package.manifest
    weights = sum(f.size for f in m.files if f.role in WEIGHT_ROLES)
    needs = m.pipeline.models if m.pipeline is not None else ()
    return PackageRef(variant_id(package), m.artifact_id, m.name, m.version, m.target.name, variant_label(package), str(kept),
                      m.payload.size, m.kind, weights, needs)


def parse_waves(text: str) -> list[str]:
    """Check ``1,10%,50%,100%``: counts or percentages, non-decreasing by kind."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise UserError("--waves: give at least one wave, e.g. 1,10%,50%,100%")
    for p in parts:
        number = p[:-1] if p.endswith("%") else p
        if not number.replace(".", "", 1).isdigit() or float(number) <= 0 or (p.endswith("%") and float(number) > 100):
            raise UserError(f"--waves: {p!r} is not a device count or a percentage in (0, 100]")
    return parts


def _cumulative(parts: Sequence[str], total: int) -> list[int]:
    """Wave sizes: never below the wave before, never above the fleet, and the last one is the whole fleet."""
    wanted = [math.ceil(float(p[:-1]) / 100 * total) if p.endswith("%") else int(float(p)) for p in parts]
    sizes = {min(n, total) for n in itertools.accumulate(wanted, max)} | {total}
    return sorted(s for s in sizes if s > 0)


def choose_variant(target: str | None, packages: Sequence[Package]) -> Package | None:
    """The package built for this target; one for 'any' only when none names the target."""
    exact = [p for p in packages if p.manifest.target.name != "any" and p.manifest.target.accepts(target)]
    if exact:
        return max(exact, key=lambda p: p.manifest.target.name == target)
    return next((p for p in packages if p.manifest.target.name == "any"), None)


def check_variants(packages: Sequence[Package]) -> dict[str, Package]:
    """One package per target, all of one model; the same package given twice counts once."""
    by_variant = {variant_id(p): p for p in packages}
    names = sorted({p.manifest.name for p in by_variant.values()})
    if len(names) > 1:
        raise UserError(f"the packages of one rollout are variants of one model: got {', '.join(map(repr, names))}")
    targets: dict[str, Package] = {}
    payloads: dict[str, Package] = {}
    for package in by_variant.values():
        # Equal payloads share one artifact topic, so they must be cut into the same chunks.
        same = payloads.setdefault(package.manifest.artifact_id, package)
        if same.manifest.payload.chunk_size != package.manifest.payload.chunk_size:
            raise UserError(f"{same.path.name} and {package.path.name} carry the same payload in different chunk sizes: "
                            "build them with the same --chunk-size")
        target = package.manifest.target.name
        if target in targets:
            raise UserError(f"two packages for target {target!r} ({targets[target].path.name}, {package.path.name}): "
                            "give one package per target")
        targets[target] = package
    return by_variant


def plan_rollout(devices: Sequence[dict[str, Any]], packages: Sequence[Package], waves: str, bake_s: float,
                 max_per_minute: int = 0, screen: Screening | None = None) -> Plan:
    """Assign each selected device (registry rows) a variant and a wave; ``max_per_minute`` paces the estimate.

    ``screen`` refuses devices that cannot take the set the package makes for them (left out of the
    waves, listed in ``refused``) and flags others (the reason of their planned entry)."""
    by_variant = check_variants(packages)
    packages = list(by_variant.values())
    plan = Plan([], by_variant, bake_s, max_per_minute=max_per_minute)
    eligible = []
    for d in devices:
        package = choose_variant(d.get("target"), packages)
        if package is None:
            reason = f"no package for target {d.get('target')!r}"
            plan.skipped.append(PlannedDevice(d["device_id"], 0, None, d.get("target"), reason))
            continue
        refusal, note = screen(d, package) if screen is not None else ("", "")
        if refusal:
            plan.refused.append(PlannedDevice(d["device_id"], 0, variant_id(package), d.get("target"), refusal))
        else:
            eligible.append((d, package, note))
    eligible.sort(key=lambda item: (item[0].get("status") != "online", item[0]["device_id"]))
    start = 0
    for wave, end in enumerate(_cumulative(parse_waves(waves), len(eligible)), start=1):
        for d, package, note in eligible[start:end]:
            plan.devices.append(PlannedDevice(d["device_id"], wave, variant_id(package), d.get("target"), note))
        start, plan.waves = end, wave
    return plan
