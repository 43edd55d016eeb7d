"""Runtime backends behind one runner contract: onnxruntime (any provider) and native OpenVINO.

The runtimes themselves are imported when a runner of theirs is opened, not here.
"""

from __future__ import annotations

from agent.backends.base import Dim, Runner, TensorSpec
from agent.backends.catalog import Candidate, candidate_backends, runtime_versions

__all__ = ["Candidate", "Dim", "Runner", "TensorSpec", "candidate_backends", "runtime_versions"]
