"""edge-agent: the device-side daemon of edgectl.

Everything under ``agent`` runs on the device and must not import host-only code
(``edgectl``, ``quantize``, ``targets``)."""

__version__ = "0.1.0"
