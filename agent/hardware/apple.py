"""macOS from its SystemVersion.plist, and Apple silicon (CPU, GPU, Neural Engine) from sysctl.

A Mac has no ``/proc``: what Linux keeps in cpuinfo and meminfo, macOS answers through sysctl. The
probe reads a ``sysctl.txt`` dump under the root (``sysctl -a > sysctl.txt``, accepted the way
Android's ``getprop.txt`` is), so tests present a Mac as a directory tree; on a live Mac (root
``/``) without a dump it asks ``sysctl`` for the few keys it needs.
"""

from __future__ import annotations

import plistlib
import subprocess
import sys
from pathlib import Path

from agent.hardware.inventory import Accelerator, Cpu

__all__ = ["SYSCTL_DUMP", "SYSTEM_VERSION", "mac_cpu", "mac_memory", "probe_apple_silicon", "read_macos", "read_sysctl"]

SYSTEM_VERSION = "System/Library/CoreServices/SystemVersion.plist"
SYSCTL_DUMP = "sysctl.txt"
_KEYS = (
    "machdep.cpu.brand_string", "hw.ncpu", "hw.memsize", "hw.optional.arm64", "hw.optional.neon",
    "hw.optional.arm.FEAT_DotProd", "hw.optional.arm.FEAT_FP16", "hw.optional.arm.FEAT_I8MM",
    "hw.optional.avx2_0", "hw.optional.avx512f",
)
# sysctl flag (value 1) -> normalised CPU feature name, as agent.hardware.cpu uses.
_FEATURES = {
    "hw.optional.neon": "neon",
    "hw.optional.arm.FEAT_DotProd": "dotprod",
    "hw.optional.arm.FEAT_FP16": "fp16",
    "hw.optional.arm.FEAT_I8MM": "i8mm",
    "hw.optional.avx2_0": "avx2",
    "hw.optional.avx512f": "avx512f",
}


def read_macos(root: Path) -> dict[str, str] | None:
    """ProductName and ProductVersion from SystemVersion.plist; None when this is not macOS."""
    try:
        data = plistlib.loads((root / SYSTEM_VERSION).read_bytes())
    except (OSError, ValueError, plistlib.InvalidFileException):
        return None
    if not isinstance(data, dict) or "ProductVersion" not in data:
        return None
    return {str(k): str(v) for k, v in data.items() if isinstance(v, str | int | float)}


def read_sysctl(root: Path) -> dict[str, str]:
    """sysctl keys from the dump under ``root``; on a live Mac without one, from ``sysctl`` itself."""
    path = root / SYSCTL_DUMP
    if path.exists():
        try:
            return _parse(path.read_text(errors="replace"))
        except OSError:
            return {}
    if root != Path("/") or sys.platform != "darwin":
        return {}
    try:  # unknown keys (an Intel Mac has no FEAT_*) only print an error: the rest still comes
        done = subprocess.run(["sysctl", *_KEYS], capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return _parse(done.stdout)


def probe_apple_silicon(sysctl: dict[str, str], macos: dict[str, str]) -> Accelerator | None:
    """Apple silicon (M-series): its GPU and Neural Engine, which CoreML dispatches to."""
    brand = sysctl.get("machdep.cpu.brand_string", "")
    if sysctl.get("hw.optional.arm64") != "1" and not brand.startswith("Apple"):
        return None
    details = {"macos": macos.get("ProductVersion", "unknown")}
    if macos.get("ProductBuildVersion"):
        details["build"] = macos["ProductBuildVersion"]
    return Accelerator("apple-silicon", brand or "Apple silicon", details)


def mac_cpu(sysctl: dict[str, str]) -> Cpu | None:
    """The CPU from sysctl; None when the keys are missing."""
    brand = sysctl.get("machdep.cpu.brand_string")
    if not brand:
        return None
    arm = sysctl.get("hw.optional.arm64") == "1" or brand.startswith("Apple")
    cores = sysctl.get("hw.ncpu", "")
    features = tuple(sorted({name for key, name in _FEATURES.items() if sysctl.get(key) == "1"}))
    return Cpu(
        model=brand,
        vendor="Apple" if arm else brand.split()[0],
        arch="aarch64" if arm else "x86_64",
        cores=int(cores) if cores.isdigit() else 0,
        features=features,
    )


def mac_memory(sysctl: dict[str, str]) -> int:
    """Total memory in bytes (0 when unknown)."""
    value = sysctl.get("hw.memsize", "")
    return int(value) if value.isdigit() else 0


def _parse(text: str) -> dict[str, str]:
    """``key: value`` lines (macOS ``sysctl`` output); ``key = value`` (BSD style) too."""
    values = {}
    for line in text.splitlines():
        sep = ":" if ": " in line or line.endswith(":") else "="
        key, found, value = line.partition(sep)
        if found and key.strip():
            values[key.strip()] = value.strip()
    return values
