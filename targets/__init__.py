"""Target profiles and partition analysis: know, before deploying, what will run where.

Public API::

    profile = targets.load_profile("nnapi")
    analysis = targets.analyse(model, profile)   # onnx.ModelProto in, Analysis out
    analysis.verdict, analysis.to_dict()
"""

from __future__ import annotations

from targets.analysis import Analysis, NodeAssignment, Partition, analyse, prepare_model
from targets.profile import (
    ExecutionProvider,
    OpSupport,
    PartitionLimits,
    PrecisionPolicy,
    ShapePolicy,
    TargetProfile,
    list_profiles,
    load_profile,
    load_profile_file,
    profile_dirs,
)

__all__ = [
    "Analysis",
    "ExecutionProvider",
    "NodeAssignment",
    "OpSupport",
    "Partition",
    "PartitionLimits",
    "PrecisionPolicy",
    "ShapePolicy",
    "TargetProfile",
    "analyse",
    "list_profiles",
    "load_profile",
    "load_profile_file",
    "prepare_model",
    "profile_dirs",
]
