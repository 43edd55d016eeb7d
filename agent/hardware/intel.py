"""Intel accelerators: Movidius sticks (USB 03e7), NPUs (``/dev/accel``), integrated GPUs."""

from __future__ import annotations

from pathlib import Path

from agent.hardware.cpu import read_text
from agent.hardware.inventory import Accelerator

__all__ = ["probe_accel_npus", "probe_intel_gpus", "probe_movidius"]

MOVIDIUS_VENDOR = "03e7"
_MOVIDIUS_PRODUCTS = {
    "2150": "Myriad 2 (not booted)",
    "2485": "Myriad X (not booted)",
    "f63b": "Myriad (booted)",
}
_ACCEL_VENDORS = {"0x8086": "intel-npu", "0x1022": "amd-npu"}


def probe_movidius(root: Path) -> list[Accelerator]:
    """Movidius VPUs on USB (Neural Compute Stick 1 and 2)."""
    found = []
    for vendor_file in sorted((root / "sys/bus/usb/devices").glob("*/idVendor")):
        if (read_text(vendor_file) or "").lower() != MOVIDIUS_VENDOR:
            continue
        product = (read_text(vendor_file.parent / "idProduct") or "").lower()
        name = _MOVIDIUS_PRODUCTS.get(product, f"Movidius 03e7:{product}")
        found.append(Accelerator("movidius", name, {"usb": vendor_file.parent.name, "product": product}))
    return found


def probe_accel_npus(root: Path) -> list[Accelerator]:
    """NPUs exposed through the kernel accel subsystem; the PCI vendor says whose."""
    found = []
    for node in sorted((root / "dev/accel").glob("accel*")):
        vendor = read_text(root / "sys/class/accel" / node.name / "device/vendor") or "unknown"
        kind = _ACCEL_VENDORS.get(vendor.lower(), "npu")
        name = "Intel NPU" if kind == "intel-npu" else f"NPU ({vendor})"
        found.append(Accelerator(kind, name, {"node": f"/dev/accel/{node.name}", "vendor": vendor}))
    return found


def probe_intel_gpus(root: Path) -> list[Accelerator]:
    """Intel GPUs (OpenVINO's GPU plugin) from the DRM cards' PCI vendor."""
    found = []
    for vendor_file in sorted((root / "sys/class/drm").glob("card[0-9]*/device/vendor")):
        if "-" in vendor_file.parent.parent.name:  # card0-HDMI-A-1 is a connector, not a card
            continue
        if (read_text(vendor_file) or "").lower() == "0x8086":
            device = read_text(vendor_file.parent / "device") or "unknown"
            card = vendor_file.parent.parent.name
            found.append(Accelerator("intel-gpu", "Intel GPU", {"card": card, "device": device}))
    return found
