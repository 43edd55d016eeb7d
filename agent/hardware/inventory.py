"""What a device is made of: CPU, memory, accelerators, thermal sensors (plain data)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["Accelerator", "Cpu", "Hardware", "ThermalZone"]


@dataclass(frozen=True)
class Cpu:
    """The CPU: model, vendor, architecture, logical cores and the features backends care about.

    ``features`` are normalised names: ``avx2``, ``avx512f``, ``avx512_vnni``, ``avx_vnni``,
    ``amx``, ``neon``, ``dotprod``, ``fp16``, ``i8mm``, ``sve``.
    """

    model: str
    vendor: str
    arch: str
    cores: int
    features: tuple[str, ...] = ()


@dataclass(frozen=True)
class Accelerator:
    """One accelerator: ``kind`` is a stable key (``jetson``, ``nvidia-gpu``, ``movidius``,
    ``intel-npu``, ``intel-gpu``, ``npu``, ``nnapi``, ``qualcomm``, ``apple-silicon``), ``name`` is for people."""

    kind: str
    name: str
    details: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ThermalZone:
    """One temperature sensor (``/sys/class/thermal/thermal_zoneN``)."""

    zone: str
    type: str
    celsius: float


@dataclass(frozen=True)
class Hardware:
    """Everything the probe found under one root directory; ``os`` is ``linux``, ``android`` or ``macos``."""

    root: str
    os: str
    cpu: Cpu
    memory_bytes: int
    accelerators: tuple[Accelerator, ...] = ()
    thermal: tuple[ThermalZone, ...] = ()

    def has(self, kind: str) -> bool:
        """Whether an accelerator of this kind is present."""
        return any(acc.kind == kind for acc in self.accelerators)

    def accelerator(self, kind: str) -> Accelerator | None:
        """The first accelerator of this kind, if any."""
        return next((acc for acc in self.accelerators if acc.kind == kind), None)

    def to_dict(self) -> dict[str, Any]:
        """Every field, JSON-ready."""
        data = asdict(self)
        data["cpu"]["features"] = list(self.cpu.features)
        data["accelerators"] = [asdict(acc) for acc in self.accelerators]
        data["thermal"] = [asdict(zone) for zone in self.thermal]
        return data

    def fingerprint(self) -> str:
        """A stable hash of what decides performance (not temperatures, not the root path)."""
        stable = {
            "os": self.os,
            "cpu": asdict(self.cpu),
            # Rounded to GiB so that memory reserved by the kernel at boot does not change it.
            "memory_gib": round(self.memory_bytes / 2**30),
            "accelerators": sorted(
                json.dumps(asdict(acc), sort_keys=True) for acc in self.accelerators
            ),
        }
        blob = json.dumps(stable, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def summary(self) -> dict[str, Any]:
        """A short dict for the MQTT birth message."""
        return {
            "os": self.os,
            "cpu": self.cpu.model,
            "arch": self.cpu.arch,
            "cores": self.cpu.cores,
            "memory_mib": self.memory_bytes // 2**20,
            "features": list(self.cpu.features),
            "accelerators": [f"{acc.kind}:{acc.name}" for acc in self.accelerators],
            "fingerprint": self.fingerprint(),
        }
