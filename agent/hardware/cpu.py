"""CPU and memory from ``<root>/proc/cpuinfo`` and ``<root>/proc/meminfo``."""

from __future__ import annotations

import os
import platform
from pathlib import Path

from agent.hardware.inventory import Cpu

__all__ = ["probe_cpu", "probe_memory", "read_text"]

# cpuinfo flag -> normalised feature name (x86 "flags", ARM "Features").
_FEATURES = {
    "avx2": "avx2",
    "avx512f": "avx512f",
    "avx512_vnni": "avx512_vnni",
    "avx_vnni": "avx_vnni",
    "amx_tile": "amx",
    "amx_int8": "amx",
    "amx_bf16": "amx",
    "neon": "neon",
    "asimd": "neon",
    "asimddp": "dotprod",
    "asimdhp": "fp16",
    "fphp": "fp16",
    "i8mm": "i8mm",
    "sve": "sve",
}
_ARM_IMPLEMENTERS = {"0x41": "ARM", "0x51": "Qualcomm", "0x4e": "NVIDIA", "0x61": "Apple"}


def read_text(path: Path) -> str | None:
    """A small system file's text without NUL padding, or None when it is absent or unreadable."""
    try:
        return path.read_bytes().replace(b"\x00", b"").decode("utf-8", "replace").strip()
    except OSError:
        return None


def probe_cpu(root: Path) -> Cpu:
    """Parse cpuinfo; fall back to the running machine's view only when probing ``/``."""
    blocks = _cpuinfo_blocks(read_text(root / "proc/cpuinfo") or "")
    first = blocks[0] if blocks else {}
    flags = set((first.get("flags") or first.get("Features") or "").split())
    features = tuple(sorted({_FEATURES[f] for f in flags if f in _FEATURES}))
    cores = sum(1 for block in blocks if "processor" in block) or _live_cores(root)
    return Cpu(
        model=_model_name(root, first),
        vendor=_vendor(first),
        arch=_arch(root, flags),
        cores=cores,
        features=features,
    )


def probe_memory(root: Path) -> int:
    """Total memory in bytes from meminfo (0 when unknown)."""
    for line in (read_text(root / "proc/meminfo") or "").splitlines():
        key, _, value = line.partition(":")
        if key == "MemTotal":
            return int(value.split()[0]) * 1024
    return 0


def _cpuinfo_blocks(text: str) -> list[dict[str, str]]:
    """cpuinfo as one dict per blank-line separated block (one per core, plus a trailer on ARM)."""
    blocks: list[dict[str, str]] = []
    current: dict[str, str] = {}
    for line in [*text.splitlines(), ""]:
        if not line.strip():
            if current:
                blocks.append(current)
            current = {}
            continue
        key, _, value = line.partition(":")
        current[key.strip()] = value.strip()
    # ARM kernels put "Hardware"/"Model" in a trailing block: fold it into the first one.
    if len(blocks) > 1 and "processor" not in blocks[-1]:
        blocks[0] = {**blocks[-1], **blocks[0]}
        blocks.pop()
    return blocks


def _model_name(root: Path, info: dict[str, str]) -> str:
    for key in ("model name", "Model", "Hardware", "cpu model"):
        if info.get(key):
            return info[key]
    dt_model = read_text(root / "proc/device-tree/model")
    if dt_model:
        return dt_model
    part = info.get("CPU part")
    return f"{_vendor(info)} CPU part {part}" if part else "unknown"


def _vendor(info: dict[str, str]) -> str:
    if info.get("vendor_id"):
        return info["vendor_id"]
    return _ARM_IMPLEMENTERS.get(info.get("CPU implementer", "").lower(), "unknown")


def _arch(root: Path, flags: set[str]) -> str:
    # On the device itself, the interpreter's own architecture: it decides which runtimes' builds run here, and under
    # emulation (qemu-user) /proc/cpuinfo describes the host's CPU, not the one the binaries are built for.
    if root == Path("/") and platform.machine():
        return platform.machine()
    if "lm" in flags or "sse2" in flags:
        return "x86_64"
    if "asimd" in flags:
        return "aarch64"
    if "neon" in flags:
        return "armv7l"
    return "unknown"


def _live_cores(root: Path) -> int:
    return (os.cpu_count() or 1) if root == Path("/") else 0
