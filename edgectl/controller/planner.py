"""Rollout plans: which package variant each device gets, and which wave it is in.

Waves are cumulative sizes: ``1,10%,50%,100%`` over 40 devices gives waves of 1, 3, 16 and 20
devices. Online devices come first so the canary wave is made of devices that can answer; the
last wave always reaches every matching device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from agent.errors import UserError
from edgectl.package import Package

__all__ = ["Plan", "PlannedDevice", "choose_variant", "parse_waves", "plan_rollout"]

# Assumptions for the duration estimate (docs/fleet.md): broker fan-out throughput and the
# agent's verify + stage + activate + health time.
TRANSFER_BYTES_PER_S = 2_000_000
INSTALL_S = 15.0


@dataclass(frozen=True)
class PlannedDevice:
    device_id: str
    wave: int  # 1-based; 0 when skipped
    variant: Optional[str]  # artifact id
    target: Optional[str]
    reason: str = ""


@dataclass
class Plan:
    devices: list[PlannedDevice]
    packages: dict[str, Package]  # artifact id -> package
    bake_s: float
    waves: int = 0
    skipped: list[PlannedDevice] = field(default_factory=list)

    def wave_devices(self, wave: int) -> list[PlannedDevice]:
        return [d for d in self.devices if d.wave == wave]

    def wave_bytes(self, wave: int) -> int:
        """Bytes the broker sends for a wave: each variant's payload once, fanned out to all."""
        variants = {d.variant for d in self.wave_devices(wave) if d.variant}
        return sum(self.packages[v].manifest.payload.size for v in variants)

    def estimated_s(self) -> float:
        return sum(self.wave_bytes(w) / TRANSFER_BYTES_PER_S + INSTALL_S + self.bake_s for w in range(1, self.waves + 1))

    def to_dict(self) -> dict[str, Any]:
        return {
            "waves": [
                {"wave": w, "devices": [{"device_id": d.device_id, "target": d.target,
                                         "variant": _label(self.packages[d.variant]) if d.variant else None}
                                        for d in self.wave_devices(w)],
                 "bytes": self.wave_bytes(w)}
                for w in range(1, self.waves + 1)
            ],
            "skipped": [{"device_id": d.device_id, "target": d.target, "reason": d.reason} for d in self.skipped],
            "total_bytes": sum(self.wave_bytes(w) for w in range(1, self.waves + 1)),
            "estimated_s": round(self.estimated_s(), 1),
            "bake_s": self.bake_s,
        }


def _label(package: Package) -> str:
    m = package.manifest
    return f"{m.name} v{m.version} ({m.target.name})"


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
    sizes = []
    for p in parts:
        n = math.ceil(float(p[:-1]) / 100 * total) if p.endswith("%") else int(float(p))
        sizes.append(min(max(n, sizes[-1] if sizes else 0), total))
    if not sizes or sizes[-1] < total:
        sizes.append(total)
    return sorted(set(s for s in sizes if s > 0))


def choose_variant(target: Optional[str], packages: Sequence[Package]) -> Optional[Package]:
    """The package built for this target; one for 'any' only when none names the target."""
    exact = [p for p in packages if p.manifest.target.name != "any" and p.manifest.target.accepts(target)]
    if exact:
        return max(exact, key=lambda p: p.manifest.target.name == target)
    return next((p for p in packages if p.manifest.target.name == "any"), None)


def plan_rollout(devices: Sequence[dict[str, Any]], packages: Sequence[Package], waves: str, bake_s: float) -> Plan:
    """Assign each selected device (registry rows) a variant and a wave."""
    by_artifact = {p.manifest.artifact_id: p for p in packages}
    plan = Plan([], by_artifact, bake_s)
    eligible = []
    for d in devices:
        package = choose_variant(d.get("target"), packages)
        if package is None:
            reason = f"no package for target {d.get('target')!r}"
            plan.skipped.append(PlannedDevice(d["device_id"], 0, None, d.get("target"), reason))
        else:
            eligible.append((d, package))
    eligible.sort(key=lambda item: (item[0].get("status") != "online", item[0]["device_id"]))
    start = 0
    for wave, end in enumerate(_cumulative(parse_waves(waves), len(eligible)), start=1):
        for d, package in eligible[start:end]:
            plan.devices.append(PlannedDevice(d["device_id"], wave, package.manifest.artifact_id, d.get("target")))
        start, plan.waves = end, wave
    return plan
