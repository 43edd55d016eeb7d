"""Temperature sensors from ``<root>/sys/class/thermal/thermal_zone*``."""

from __future__ import annotations

from pathlib import Path

from agent.hardware.cpu import read_text
from agent.hardware.inventory import ThermalZone

__all__ = ["probe_thermal"]


def probe_thermal(root: Path) -> list[ThermalZone]:
    """Every readable thermal zone; the kernel reports millidegrees Celsius."""
    zones = []
    for zone in sorted((root / "sys/class/thermal").glob("thermal_zone*")):
        raw = read_text(zone / "temp")
        if raw is None or not raw.lstrip("-").isdigit():
            continue  # a sensor that is off or asleep reads as an error, not a number
        kind = read_text(zone / "type") or "unknown"
        zones.append(ThermalZone(zone.name, kind, int(raw) / 1000.0))
    return zones
