"""edge-agent: the device-side daemon of edgectl.

Everything under ``agent`` runs on the device. It imports ``edgecore`` and must not import
host-only code (``edgectl``, ``quantize``, ``targets``); nothing outside ``agent`` imports it
except the benchmark scripts and the tests.
"""

from edgecore import __version__

__all__ = ["__version__"]
