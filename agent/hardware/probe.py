"""Probe a device from a root directory: ``/`` on the device, a fixture tree in tests."""

from __future__ import annotations

from pathlib import Path

from agent.hardware.android import probe_nnapi, probe_qualcomm, read_properties
from agent.hardware.cpu import probe_cpu, probe_memory
from agent.hardware.intel import probe_accel_npus, probe_intel_gpus, probe_movidius
from agent.hardware.inventory import Accelerator, Hardware
from agent.hardware.nvidia import probe_jetson, probe_nvidia_gpus
from agent.hardware.thermal import probe_thermal

__all__ = ["probe_hardware"]


def probe_hardware(root: Path = Path("/")) -> Hardware:
    """Read CPU, memory, accelerators and thermal sensors from files under ``root``.

    Missing or unreadable files mean "not present": the probe never fails on a device that
    lacks a subsystem.
    """
    root = Path(root)
    cpu = probe_cpu(root)
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
    return Hardware(
        root=str(root),
        os="android" if "ro.build.version.sdk" in props else "linux",
        cpu=cpu,
        memory_bytes=probe_memory(root),
        accelerators=tuple(accelerators),
        thermal=tuple(probe_thermal(root)),
    )
