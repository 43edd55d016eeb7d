"""Probe a device from a root directory: ``/`` on the device, a fixture tree in tests."""

from __future__ import annotations

from pathlib import Path

from agent.hardware.android import probe_nnapi, probe_qualcomm, read_properties
from agent.hardware.apple import mac_cpu, mac_memory, probe_apple_silicon, read_macos, read_sysctl
from agent.hardware.cpu import probe_cpu, probe_memory
from agent.hardware.intel import probe_accel_npus, probe_intel_gpus, probe_movidius
from agent.hardware.inventory import Accelerator, Hardware
from agent.hardware.nvidia import probe_jetson, probe_nvidia_gpus
from agent.hardware.thermal import probe_thermal

__all__ = ["probe_hardware"]


def probe_hardware(root: Path = Path("/")) -> Hardware:
    """Read CPU, memory, accelerators and thermal sensors from files under ``root``.

    Missing or unreadable files mean "not present": the probe never fails on a device that
    lacks a subsystem. macOS is recognised by its SystemVersion.plist and read through sysctl.
    """
    root = Path(root)
    macos = read_macos(root)
    sysctl = read_sysctl(root) if macos is not None else {}
    cpu = mac_cpu(sysctl) or probe_cpu(root)
    props = read_properties(root)
    accelerators: list[Accelerator] = []
    jetson = probe_jetson(root)
    if jetson:
        accelerators.append(jetson)
    accelerators += probe_nvidia_gpus(root)
    accelerators += probe_movidius(root)
    accelerators += probe_accel_npus(root)
    accelerators += probe_intel_gpus(root)
    nnapi = probe_nnapi(props)
    if nnapi:
        accelerators.append(nnapi)
    qualcomm = probe_qualcomm(root, props, cpu.model)
    if qualcomm:
        accelerators.append(qualcomm)
    apple = probe_apple_silicon(sysctl, macos) if macos is not None else None
    if apple:
        accelerators.append(apple)
    return Hardware(
        root=str(root),
        os=_os(macos, props),
        cpu=cpu,
        memory_bytes=mac_memory(sysctl) or probe_memory(root),
        accelerators=tuple(accelerators),
        thermal=tuple(probe_thermal(root)),
    )


def _os(macos: dict[str, str] | None, props: dict[str, str]) -> str:
    if macos is not None:
        return "macos"
    return "android" if "ro.build.version.sdk" in props else "linux"
