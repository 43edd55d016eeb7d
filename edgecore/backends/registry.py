"""Backends by registration: each backend module declares what it drives; everything else reads it.

A backend module (``edgecore/backends/<name>.py``) defines ``BACKEND = Backend(...)``: its name, the
devices it drives per accelerator kind and on the host CPU, each device's precisions and
quantization family, how to list what the installed runtime offers, its version, and how to open a
runner. The default registry imports every module of this package once and keeps those that
define ``BACKEND`` (after Polygraphy, which finds runners by class, and Olive, which registers
passes), so adding a backend is one new module. ``register`` adds one from anywhere else.

The catalog (``catalog.py``), staging, the controller's fallback gate and the quantizer read this
registry; none of them names a backend. Runtimes are imported inside the declared callables only,
so reading the registry costs no runtime import.
"""

from __future__ import annotations

import importlib
import pkgutil
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from edgecore.backends.base import Runner
from edgecore.errors import ConfigError

__all__ = [
    "PRECISIONS",
    "Backend",
    "BackendRegistry",
    "Device",
    "HostDevice",
    "default_registry",
    "register",
]

PRECISIONS = ("fp32", "fp16", "int8")


@dataclass(frozen=True)
class Device:
    """One way a backend runs a model: an onnxruntime execution provider, an OpenVINO device.

    ``family`` is the quantization family of its execution provider (``quantize/recipe.py``:
    tensorrt, nnapi, qnn, openvino, cpu, ...): the quantized format the provider accepts.
    ``precisions`` are the model precisions it runs; selection skips it for any other.
    """

    name: str
    family: str
    options: Mapping[str, str] = field(default_factory=dict)
    precisions: tuple[str, ...] = PRECISIONS


@dataclass(frozen=True)
class HostDevice:
    """A device on the host CPU side, with the architectures and systems where it applies (None: any)."""

    device: Device
    arches: tuple[str, ...] | None = None
    systems: tuple[str, ...] | None = None

    def applies(self, arch: str, system: str) -> bool:
        """Whether a CPU architecture and operating system fit."""
        arch_ok = self.arches is None or arch in self.arches
        return arch_ok and (self.systems is None or system in self.systems)


Opener = Callable[[Path, str, Mapping[str, str]], Runner]


@dataclass(frozen=True)
class Backend:
    """What one runtime backend drives, and how to reach its runtime.

    ``provider`` is the execution provider a target profile names for every device of this
    backend (``OpenVINOExecutionProvider`` for native OpenVINO); ``None`` when each device *is* an
    execution provider (onnxruntime). ``offered`` lists what the installed runtime offers (device
    or provider names; OpenVINO numbers devices ``GPU.0``); it and ``runtime_version`` may raise
    ImportError when the runtime is not installed. ``reference`` names the device every machine
    has, used for staging and reference outputs. ``notes`` say, per device, where it exists, for
    ``edge-agent probe`` to explain an absent candidate.
    """

    name: str
    open: Opener
    offered: Callable[[], Sequence[str]]
    runtime_version: Callable[[], str]
    accelerators: Mapping[str, tuple[Device, ...]] = field(default_factory=dict)
    host: tuple[HostDevice, ...] = ()
    provider: str | None = None
    reference: str | None = None
    rank: int = 100
    notes: Mapping[str, str] = field(default_factory=dict)

    def devices(self) -> list[Device]:
        """Every declared device, accelerators first, in declaration order."""
        found = [d for devices in self.accelerators.values() for d in devices] + [h.device for h in self.host]
        return list({(d.name, tuple(sorted(d.options.items()))): d for d in found}.values())

    def provider_of(self, device: str) -> str:
        """The execution-provider name a target profile lists for ``device``."""
        return self.provider or device

    def device(self, name: str, options: Mapping[str, str] | None = None) -> Device | None:
        """The declaration of ``name`` (with these options when several share the name)."""
        named = [d for d in self.devices() if d.name == name]
        exact = [d for d in named if options is not None and dict(d.options) == dict(options)]
        found = exact or named
        return found[0] if found else None

    def families(self) -> dict[str, str]:
        """Execution provider -> quantization family, over the declared devices."""
        return {self.provider_of(d.name): d.family for d in self.devices()}


class BackendRegistry:
    """Backends by name; ``register`` refuses a second backend of one name or a conflicting family."""

    def __init__(self, backends: Sequence[Backend] = ()) -> None:
        self._backends: dict[str, Backend] = {}
        for backend in backends:
            self.register(backend)

    def register(self, backend: Backend) -> Backend:
        """Add ``backend``; ConfigError when its name is taken or an EP's family disagrees."""
        if backend.name in self._backends:
            raise ConfigError(f"backend '{backend.name}' is already registered")
        known = self.families()
        for device in backend.devices():
            provider, family = backend.provider_of(device.name), device.family
            if known.setdefault(provider, family) != family:
                raise ConfigError(
                    f"backend '{backend.name}' declares {provider} as quantization family '{family}', "
                    f"already declared '{known[provider]}'"
                )
        self._backends[backend.name] = backend
        return backend

    def __iter__(self) -> Iterator[Backend]:
        return iter(sorted(self._backends.values(), key=lambda b: (b.rank, b.name)))

    def names(self) -> list[str]:
        """Registered backend names, in candidate order."""
        return [b.name for b in self]

    def get(self, name: str) -> Backend:
        """The backend called ``name``; ConfigError naming the known ones otherwise."""
        try:
            return self._backends[name]
        except KeyError:
            raise ConfigError(f"unknown backend '{name}' (known: {', '.join(self.names())})") from None

    def families(self) -> dict[str, str]:
        """Execution provider -> quantization family, over every registered backend."""
        merged: dict[str, str] = {}
        for backend in self:
            merged.update(backend.families())
        return merged

    def family_of(self, provider: str) -> str | None:
        """The quantization family a backend declares for ``provider``; None when none declares it."""
        return self.families().get(provider)

    def provider_of(self, runner_name: str) -> str | None:
        """The EP a runner name (``openvino/NPU``) stands for; None for an unknown backend."""
        backend, _, device = runner_name.partition("/")
        if backend not in self._backends or not device:
            return None
        return self._backends[backend].provider_of(device)

    def runtime_versions(self) -> dict[str, str]:
        """Backend -> installed runtime version, for those whose runtime is installed."""
        versions = {}
        for backend in self:
            try:
                versions[backend.name] = backend.runtime_version()
            except ImportError:
                continue
        return versions

    def offered(self, backend: Backend) -> list[str]:
        """What ``backend``'s installed runtime offers; empty when the runtime is not installed."""
        try:
            return list(backend.offered())
        except ImportError:
            return []


_default: BackendRegistry | None = None
_default_lock = threading.Lock()


def default_registry() -> BackendRegistry:
    """The process-wide registry: every module of ``edgecore.backends`` that defines ``BACKEND``."""
    global _default
    with _default_lock:
        if _default is None:
            _default = BackendRegistry(_discover())
        return _default


def register(backend: Backend) -> Backend:
    """Add ``backend`` to the process-wide registry (for backends that live outside this package)."""
    return default_registry().register(backend)


def _discover() -> list[Backend]:
    import edgecore.backends as package

    found = []
    for module_info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{package.__name__}.{module_info.name}")
        backend = getattr(module, "BACKEND", None)
        if isinstance(backend, Backend):
            found.append(backend)
    return found
