"""Hardware detection from a configurable root directory (``/`` on a device, a tree in tests)."""

from __future__ import annotations

from agent.hardware.inventory import Accelerator, Cpu, Hardware, ThermalZone
from agent.hardware.probe import probe_hardware

__all__ = ["Accelerator", "Cpu", "Hardware", "ThermalZone", "probe_hardware"]
