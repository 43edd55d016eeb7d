"""Which backends a device can run: hardware x installed runtimes x the target's allowed list.

This is data plus a pure function (``candidate_backends``); the runtimes' own lists of providers
and devices are parameters so tests can present a Jetson's or a phone's runtime. Runtimes are
imported lazily: an idle agent with no model does not pay for them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.backends.base import Runner
from agent.errors import ConfigError
from agent.hardware import Hardware

__all__ = ["Candidate", "candidate_backends", "runtime_versions"]

CPU = "CPUExecutionProvider"
OPENVINO_EP = "OpenVINOExecutionProvider"

# Accelerator kind -> onnxruntime providers that drive it, best first, with provider options.
_ORT_BY_ACCELERATOR: dict[str, list[tuple[str, dict[str, str]]]] = {
    "jetson": [("TensorrtExecutionProvider", {}), ("CUDAExecutionProvider", {})],
    "nvidia-gpu": [("TensorrtExecutionProvider", {}), ("CUDAExecutionProvider", {})],
    "nnapi": [("NnapiExecutionProvider", {})],
    "qualcomm": [("QNNExecutionProvider", {"backend_path": "libQnnHtp.so"})],
    "intel-npu": [(OPENVINO_EP, {"device_type": "NPU"})],
    "intel-gpu": [(OPENVINO_EP, {"device_type": "GPU"})],
    "movidius": [(OPENVINO_EP, {"device_type": "MYRIAD"})],
}
# Accelerator kind -> native OpenVINO device.
_OPENVINO_BY_ACCELERATOR = {"intel-npu": "NPU", "intel-gpu": "GPU", "movidius": "MYRIAD"}
_OPENVINO_CPU_ARCHES = ("x86_64", "aarch64")
_XNNPACK_ARCHES = ("aarch64", "armv7l")


@dataclass(frozen=True)
class Candidate:
    """One backend to try: ``onnxruntime`` with a provider, or ``openvino`` with a device."""

    backend: str
    device: str
    options: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """``onnxruntime/CPUExecutionProvider``, ``openvino/CPU``: the runner's name."""
        return f"{self.backend}/{self.device}"

    @property
    def provider(self) -> str:
        """The execution-provider name a target profile lists for this candidate."""
        return self.device if self.backend == "onnxruntime" else OPENVINO_EP

    def matches(self, allowed: Sequence[str]) -> bool:
        """Whether a target's allowed list names this candidate (by EP, backend or full name)."""
        return bool({self.name, self.provider, self.backend} & set(allowed))

    def open(self, model_path: Path) -> Runner:
        """A new, inactive runner of this candidate on ``model_path``."""
        if self.backend == "onnxruntime":
            from agent.backends.onnxruntime import OrtRunner, OrtSessionLoader

            return OrtRunner(OrtSessionLoader(model_path, self.device, self.options))
        if self.backend == "openvino":
            from agent.backends.openvino import OvModelLoader, OvRunner

            return OvRunner(OvModelLoader(model_path, self.device, self.options))
        raise ConfigError(f"unknown backend '{self.backend}' (known: onnxruntime, openvino)")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, as cached and reported."""
        return {"backend": self.backend, "device": self.device, "options": dict(self.options)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Candidate:
        """Inverse of ``to_dict``."""
        return cls(str(data["backend"]), str(data["device"]), dict(data.get("options", {})))


def candidate_backends(
    hardware: Hardware,
    allowed: Sequence[str] | None = None,
    *,
    ort_providers: Sequence[str] | None = None,
    openvino_devices: Sequence[str] | None = None,
) -> list[Candidate]:
    """Backends this hardware has and the installed runtimes offer, filtered by ``allowed``.

    ``ort_providers`` and ``openvino_devices`` default to what the installed runtimes report.
    """
    if ort_providers is None:
        ort_providers = _installed_ort_providers()
    if openvino_devices is None:
        openvino_devices = _installed_openvino_devices()
    found = [c for c in _ort_wanted(hardware) if c.device in ort_providers]
    found += [c for c in _openvino_wanted(hardware) if _has_device(openvino_devices, c.device)]
    if allowed is not None:
        found = [c for c in found if c.matches(allowed)]
    return found


def runtime_versions() -> dict[str, str]:
    """Versions of the installed runtimes (part of the selection cache key)."""
    versions = {}
    try:
        from agent.backends.onnxruntime import runtime_version as ort_version

        versions["onnxruntime"] = ort_version()
    except ImportError:
        pass
    try:
        from agent.backends.openvino import runtime_version as ov_version

        versions["openvino"] = ov_version()
    except ImportError:
        pass
    return versions


def _ort_wanted(hardware: Hardware) -> list[Candidate]:
    wanted: list[Candidate] = []
    for acc in hardware.accelerators:
        for provider, options in _ORT_BY_ACCELERATOR.get(acc.kind, []):
            wanted.append(Candidate("onnxruntime", provider, options))
    if hardware.cpu.arch in _OPENVINO_CPU_ARCHES and hardware.os == "linux":
        wanted.append(Candidate("onnxruntime", OPENVINO_EP, {"device_type": "CPU"}))
    if hardware.cpu.arch in _XNNPACK_ARCHES:
        wanted.append(Candidate("onnxruntime", "XnnpackExecutionProvider", {}))
    wanted.append(Candidate("onnxruntime", CPU, {}))
    return _unique(wanted)


def _openvino_wanted(hardware: Hardware) -> list[Candidate]:
    wanted = [
        Candidate("openvino", _OPENVINO_BY_ACCELERATOR[acc.kind])
        for acc in hardware.accelerators
        if acc.kind in _OPENVINO_BY_ACCELERATOR
    ]
    if hardware.cpu.arch in _OPENVINO_CPU_ARCHES and hardware.os == "linux":
        wanted.append(Candidate("openvino", "CPU"))
    return _unique(wanted)


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


def _installed_ort_providers() -> list[str]:
    try:
        from agent.backends.onnxruntime import available_providers
    except ImportError:
        return []
    return available_providers()


def _installed_openvino_devices() -> list[str]:
    try:
        from agent.backends.openvino import available_devices
    except ImportError:
        return []
    return available_devices()
