"""Local inference API (KServe v2 / Open Inference Protocol over HTTP) and the model registry."""

from __future__ import annotations

from agent.serving.published import ModelRegistry, PublishedModel
from agent.serving.server import DEFAULT_MAX_REQUEST_BYTES, InferenceServer

__all__ = ["DEFAULT_MAX_REQUEST_BYTES", "InferenceServer", "ModelRegistry", "PublishedModel"]
