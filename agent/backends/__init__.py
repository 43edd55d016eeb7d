"""Runtime backends behind one runner contract, found through a registry (``registry.py``).

Each backend module (``onnxruntime.py``, ``openvino.py``) declares ``BACKEND``; the runtimes
themselves are imported when a runner of theirs is opened or their devices are listed, not here.
"""

from __future__ import annotations

from agent.backends.base import Dim, Placement, Runner, TensorSpec, Verdict
from agent.backends.catalog import (
    Absent,
    Candidate,
    absent_backends,
    candidate_backends,
    reference_candidate,
    runtime_versions,
)
from agent.backends.registry import Backend, BackendRegistry, Device, HostDevice, default_registry, register

__all__ = [
    "Absent",
    "Backend",
    "BackendRegistry",
    "Candidate",
    "Device",
    "Dim",
    "HostDevice",
    "Placement",
    "Runner",
    "TensorSpec",
    "Verdict",
    "absent_backends",
    "candidate_backends",
    "default_registry",
    "reference_candidate",
    "register",
    "runtime_versions",
]
