"""Which backends a device can run: hardware x installed runtimes x the target's allowed list.

This is data plus a pure function (``candidate_backends``) over the backend registry
(``registry.py``): each backend declares the devices it drives per accelerator kind and on the
host CPU. What the runtimes offer is a parameter so tests can present a Jetson's or a phone's
runtime. Runtimes are imported lazily: an idle agent with no model does not pay for them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.hardware import Hardware
from edgecore.backends.base import Runner
from edgecore.backends.registry import Backend, BackendRegistry, Device, default_registry
from edgecore.errors import ConfigError

__all__ = ["Absent", "Candidate", "absent_backends", "candidate_backends", "reference_candidate", "runtime_versions"]

Offered = Mapping[str, Sequence[str]]


@dataclass(frozen=True)
class Candidate:
    """One backend to try: a registered backend's name and one of its devices, with options."""

    backend: str
    device: str
    options: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """``onnxruntime/CPUExecutionProvider``, ``openvino/CPU``: the runner's name."""
        return f"{self.backend}/{self.device}"

    def provider(self, registry: BackendRegistry | None = None) -> str:
        """The execution-provider name a target profile lists for this candidate."""
        return (registry or default_registry()).get(self.backend).provider_of(self.device)

    def matches(self, allowed: Sequence[str], registry: BackendRegistry | None = None) -> bool:
        """Whether a target's allowed list names this candidate (by EP, backend or full name)."""
        return bool({self.name, self.provider(registry), self.backend} & set(allowed))

    def declaration(self, registry: BackendRegistry | None = None) -> Device | None:
        """The registry's declaration of this device (None for a device no backend declares)."""
        return (registry or default_registry()).get(self.backend).device(self.device, self.options)

    def open(self, model_path: Path, registry: BackendRegistry | None = None) -> Runner:
        """A new, inactive runner of this candidate on ``model_path``."""
        backend = (registry or default_registry()).get(self.backend)
        return backend.open(Path(model_path), self.device, dict(self.options))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, as cached and reported."""
        return {"backend": self.backend, "device": self.device, "options": dict(self.options)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Candidate:
        """Inverse of ``to_dict``."""
        return cls(str(data["backend"]), str(data["device"]), dict(data.get("options", {})))


@dataclass(frozen=True)
class Absent:
    """A declared device that is not a candidate here, and why."""

    name: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        """JSON-ready form for ``edge-agent probe``."""
        return {"backend": self.name, "reason": self.reason}


def candidate_backends(
    hardware: Hardware,
    allowed: Sequence[str] | None = None,
    *,
    offered: Offered | None = None,
    registry: BackendRegistry | None = None,
) -> list[Candidate]:
    """Backends this hardware has and the installed runtimes offer, filtered by ``allowed``.

    ``offered`` maps a backend name to what its runtime offers (providers, devices); a backend
    it leaves out is asked (its runtime is imported then).
    """
    registry = registry or default_registry()
    found = []
    for backend in registry:
        have = _offered(registry, backend, offered)
        found += [c for c in _wanted(backend, hardware) if _has_device(have, c.device)]
    if allowed is not None:
        found = [c for c in found if c.matches(allowed, registry)]
    return found


def absent_backends(
    hardware: Hardware, *, offered: Offered | None = None, registry: BackendRegistry | None = None
) -> list[Absent]:
    """Every declared device that is not a candidate on this hardware, with the reason."""
    registry = registry or default_registry()
    absent: dict[str, Absent] = {}
    for backend in registry:
        have = _offered(registry, backend, offered)
        wanted = {c.device for c in _wanted(backend, hardware)}
        for device in backend.devices():
            name = f"{backend.name}/{device.name}"
            if name in absent or (device.name in wanted and _has_device(have, device.name)):
                continue
            if device.name in wanted:
                why = f"the installed {backend.name} does not offer {device.name}" if have else f"{backend.name} is not installed"
            else:
                why = _not_here(backend, device, hardware)
            note = backend.notes.get(device.name)
            absent[name] = Absent(name, f"{why} ({note})" if note else why)
    return list(absent.values())


def reference_candidate(registry: BackendRegistry | None = None) -> Candidate:
    """The device every machine has, for staging and reference outputs (onnxruntime's CPU EP)."""
    for backend in registry or default_registry():
        if backend.reference is not None:
            device = backend.device(backend.reference)
            return Candidate(backend.name, backend.reference, dict(device.options) if device else {})
    raise ConfigError("no registered backend declares a reference device")


def runtime_versions(registry: BackendRegistry | None = None) -> dict[str, str]:
    """Versions of the installed runtimes (part of the selection cache key)."""
    return (registry or default_registry()).runtime_versions()


def _wanted(backend: Backend, hardware: Hardware) -> list[Candidate]:
    """The backend's devices for this hardware's accelerators, then its host devices, unique."""
    devices = [d for acc in hardware.accelerators for d in backend.accelerators.get(acc.kind, ())]
    devices += [h.device for h in backend.host if h.applies(hardware.cpu.arch, hardware.os)]
    return _unique([Candidate(backend.name, d.name, dict(d.options)) for d in devices])


def _not_here(backend: Backend, device: Device, hardware: Hardware) -> str:
    kinds = [kind for kind, devices in backend.accelerators.items() if device in devices]
    if kinds:
        return f"needs {' or '.join(kinds)} hardware: none found"
    hosts = [h for h in backend.host if h.device == device]
    where = ", ".join(f"{'/'.join(h.arches or ('any arch',))} on {'/'.join(h.systems or ('any OS',))}" for h in hosts)
    return f"needs {where}: this is {hardware.cpu.arch} on {hardware.os}"


def _offered(registry: BackendRegistry, backend: Backend, offered: Offered | None) -> list[str]:
    if offered is not None and backend.name in offered:
        return list(offered[backend.name])
    return registry.offered(backend)


def _unique(candidates: list[Candidate]) -> list[Candidate]:
    seen: set[str] = set()
    unique = []
    for c in candidates:
        key = f"{c.name}:{sorted(c.options.items())}"
        if key not in seen:
            seen.add(key)
            unique.append(c)
    return unique


def _has_device(devices: Sequence[str], device: str) -> bool:
    # OpenVINO numbers multiple devices of one kind: GPU.0, GPU.1.
    return any(d == device or d.startswith(f"{device}.") for d in devices)
