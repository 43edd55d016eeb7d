"""Android (NNAPI) from system property files, and Qualcomm SoCs on Android or Linux."""

from __future__ import annotations

import re
from pathlib import Path

from agent.hardware.cpu import read_text
from agent.hardware.inventory import Accelerator

__all__ = ["NNAPI_MIN_SDK", "PROPERTY_FILES", "probe_nnapi", "probe_qualcomm", "read_properties"]

# Later files override earlier ones, as Android's init loads them in this order.
PROPERTY_FILES = (
    "default.prop",
    "system/etc/prop.default",
    "system/build.prop",
    "vendor/build.prop",
    "vendor/default.prop",
    "odm/etc/build.prop",
    "product/etc/build.prop",
    # `adb shell getprop > getprop.txt` dumps ("[key]: [value]") are accepted too.
    "getprop.txt",
)
NNAPI_MIN_SDK = 27  # Android 8.1 introduced the Neural Networks API
_QUALCOMM_PLATFORMS = re.compile(r"^(msm|sdm|sm|qcs|qcm|apq|kona|lahaina|taro|kalama|pineapple|sun)\d*", re.I)
_GETPROP = re.compile(r"^\[(.+?)\]:\s*\[(.*)\]$")


def read_properties(root: Path) -> dict[str, str]:
    """Android system properties merged from the property files under ``root``."""
    props: dict[str, str] = {}
    for name in PROPERTY_FILES:
        for line in (read_text(root / name) or "").splitlines():
            line = line.strip()
            match = _GETPROP.match(line)
            if match:
                props[match.group(1)] = match.group(2)
            elif line and not line.startswith("#") and "=" in line:
                key, _, value = line.partition("=")
                props[key.strip()] = value.strip()
    return props


def probe_nnapi(props: dict[str, str]) -> Accelerator | None:
    """NNAPI when the Android SDK level has it."""
    sdk = props.get("ro.build.version.sdk", "")
    if not sdk.isdigit() or int(sdk) < NNAPI_MIN_SDK:
        return None
    details = {"sdk": sdk, "android": props.get("ro.build.version.release", "unknown")}
    model = props.get("ro.product.model") or props.get("ro.product.system.model") or "Android device"
    return Accelerator("nnapi", model, details)


def probe_qualcomm(root: Path, props: dict[str, str], cpuinfo_model: str) -> Accelerator | None:
    """A Qualcomm SoC (Hexagon DSP/HTP for QNN) from properties, device tree or cpuinfo."""
    manufacturer = props.get("ro.soc.manufacturer", "")
    platform = props.get("ro.board.platform", "") or props.get("ro.hardware", "")
    compatible = _device_tree_compatible(root)
    soc = props.get("ro.soc.model") or platform
    if manufacturer.upper() in ("QTI", "QUALCOMM") or _QUALCOMM_PLATFORMS.match(platform):
        return Accelerator("qualcomm", soc or "Qualcomm SoC", {"platform": platform})
    if "qcom," in compatible:
        socs = [part.split(",", 1)[1] for part in compatible.split() if part.startswith("qcom,")]
        return Accelerator("qualcomm", socs[-1] if socs else "Qualcomm SoC", {"compatible": compatible})
    if "qualcomm" in cpuinfo_model.lower():
        return Accelerator("qualcomm", cpuinfo_model, {})
    return None


def _device_tree_compatible(root: Path) -> str:
    """The device tree's compatible strings, space separated (the file separates them by NUL)."""
    try:
        raw = (root / "proc/device-tree/compatible").read_bytes()
    except OSError:
        return ""
    return " ".join(part.decode("utf-8", "replace") for part in raw.split(b"\x00") if part)
