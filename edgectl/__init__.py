"""edgectl: the workstation side: analyse, quantize, package and roll out ONNX models."""

from edgecore import __version__

__all__ = ["__version__"]
