"""Runtime backends behind one runner contract, found through a registry (``registry.py``).

Each backend module (``onnxruntime.py``, ``openvino.py``) declares ``BACKEND``; the runtimes
themselves are imported when a runner of theirs is opened or their devices are listed, not here.
"""

from __future__ import annotations

from edgecore.backends.base import Dim, Placement, Runner, TensorSpec, Verdict
from edgecore.backends.registry import Backend, BackendRegistry, Device, HostDevice, default_registry, register

__all__ = [
    "Backend",
    "BackendRegistry",
    "Device",
    "Dim",
    "HostDevice",
    "Placement",
    "Runner",
    "TensorSpec",
    "Verdict",
    "default_registry",
    "register",
]
