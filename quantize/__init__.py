"""Target-aware quantization within an accuracy budget (host side of `edgectl quantize`).

Built on onnxruntime.quantization (quantize_static/quantize_dynamic, calibration, qdq_loss_debug)
and onnxruntime.transformers.float16; this package picks the format per target, measures, and checks.
"""

from __future__ import annotations

from quantize.pipeline import QuantizeRequest, run_quantize
from quantize.recipe import CpuFeatures, Family, Mode, Recipe
from quantize.report import QuantizeReport

__all__ = ["CpuFeatures", "Family", "Mode", "QuantizeReport", "QuantizeRequest", "Recipe", "run_quantize"]
