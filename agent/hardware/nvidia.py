"""NVIDIA Jetson (L4T, JetPack, TensorRT, CUDA) and discrete NVIDIA GPUs."""

from __future__ import annotations

import re
from pathlib import Path

from agent.hardware.cpu import read_text
from agent.hardware.inventory import Accelerator

__all__ = ["probe_jetson", "probe_nvidia_gpus"]

# L4T release -> JetPack release (developer.nvidia.com/embedded/jetpack-archive).
_JETPACK = {
    "32.4.3": "4.4",
    "32.4.4": "4.4.1",
    "32.5.0": "4.5",
    "32.5.1": "4.5.1",
    "32.6.1": "4.6",
    "32.7.1": "4.6.1",
    "32.7.2": "4.6.2",
    "32.7.3": "4.6.3",
    "32.7.4": "4.6.4",
    "32.7.5": "4.6.5",
    "34.1.0": "5.0",
    "34.1.1": "5.0.1",
    "35.1.0": "5.0.2",
    "35.2.1": "5.1",
    "35.3.1": "5.1.1",
    "35.4.1": "5.1.2",
    "35.5.0": "5.1.3",
    "35.6.0": "5.1.4",
    "36.2.0": "6.0 DP",
    "36.3.0": "6.0",
    "36.4.0": "6.1",
    "36.4.3": "6.2",
    "36.4.4": "6.2.1",
}
_TEGRA = re.compile(r"#\s*R(\d+)\s*\(release\),\s*REVISION:\s*([\d.]+)")


def probe_jetson(root: Path) -> Accelerator | None:
    """A Jetson when ``etc/nv_tegra_release`` exists: L4T, JetPack, TensorRT and CUDA versions."""
    release = read_text(root / "etc/nv_tegra_release")
    if release is None:
        return None
    details: dict[str, str] = {}
    match = _TEGRA.search(release)
    if match:
        l4t = f"{match.group(1)}.{match.group(2)}"
        l4t = l4t if l4t.count(".") == 2 else f"{l4t}.0"
        details["l4t"] = l4t
        details["jetpack"] = _JETPACK.get(l4t, "unknown")
    for key, value in (("tensorrt", _tensorrt_version(root)), ("cuda", _cuda_version(root))):
        if value:
            details[key] = value
    model = read_text(root / "proc/device-tree/model") or "NVIDIA Jetson"
    return Accelerator("jetson", model, details)


def probe_nvidia_gpus(root: Path) -> list[Accelerator]:
    """Discrete GPUs from the NVIDIA driver's ``/proc/driver/nvidia/gpus/*/information``."""
    driver = read_text(root / "proc/driver/nvidia/version") or ""
    match = re.search(r"Kernel Module\s+([\d.]+)", driver)
    found = []
    for info in sorted((root / "proc/driver/nvidia/gpus").glob("*/information")):
        fields = _colon_fields(read_text(info) or "")
        details = {"bus": info.parent.name}
        if match:
            details["driver"] = match.group(1)
        found.append(Accelerator("nvidia-gpu", fields.get("Model", "NVIDIA GPU"), details))
    return found


def _tensorrt_version(root: Path) -> str | None:
    """TensorRT from its version header, the libnvinfer soname, or the dpkg database."""
    for header in root.glob("usr/include/*/NvInferVersion.h"):
        text = read_text(header) or ""
        parts = [re.search(rf"#define NV_TENSORRT_{k}\s+(\d+)", text) for k in ("MAJOR", "MINOR", "PATCH")]
        if all(parts):
            return ".".join(m.group(1) for m in parts if m)
    for lib in sorted(root.glob("usr/lib/*/libnvinfer.so.*.*")):
        return lib.name.removeprefix("libnvinfer.so.")
    status = read_text(root / "var/lib/dpkg/status") or ""
    match = re.search(r"Package: (?:tensorrt|libnvinfer\d*)\n(?:.+\n)*?Version: ([\d.]+)", status)
    return match.group(1) if match else None


def _cuda_version(root: Path) -> str | None:
    text = read_text(root / "usr/local/cuda/version.json") or read_text(
        root / "usr/local/cuda/version.txt"
    )
    match = re.search(r'"version"\s*:\s*"([\d.]+)"|CUDA Version ([\d.]+)', text or "")
    return (match.group(1) or match.group(2)) if match else None


def _colon_fields(text: str) -> dict[str, str]:
    fields = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return fields
