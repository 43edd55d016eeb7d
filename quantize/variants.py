"""Build one model variant for a recipe and, for INT8, keep sensitive nodes float until the budget holds."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnxruntime.quantization import CalibrationMethod
from rich.console import Console
from rich.progress import Progress

from quantize.calibration import StreamingReader
from quantize.evaluate import Accuracy, Outputs, measure, run_outputs
from quantize.metrics import OutputMetric
from quantize.passes import convert_fp16, fp16_block_list, quantize_dynamic_weights, quantize_int8
from quantize.recipe import Recipe
from quantize.rules import is_quantized
from quantize.samples import SampleSet
from quantize.sensitivity import TensorError, tensor_errors

__all__ = ["EvalSet", "Variant", "VariantBuilder"]

_SENSITIVITY_SAMPLES = 8  # qdq_loss_debug keeps every activation of every sample in memory
_TENSORS_PER_STEP = 2
_MAX_STEPS = 10
_PATIENCE = 3  # consecutive steps that did not help before giving up


@dataclass(frozen=True)
class EvalSet:
    """Held-out samples, optional labels and the float model's outputs on them."""

    samples: SampleSet
    labels: np.ndarray | None
    reference: Outputs
    source: str
    metrics: list[OutputMetric]


@dataclass
class Variant:
    """A produced model, its accuracy, and what the accuracy loop kept float."""

    recipe: Recipe
    model: onnx.ModelProto
    accuracy: Accuracy
    kept_float: list[str] = field(default_factory=list)
    history: list[dict[str, object]] = field(default_factory=list)
    errors: list[TensorError] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        """The recipe's name, e.g. int8 or int8-compute."""
        return self.recipe.name


class VariantBuilder:
    """Builds variants of one float model; INT8 calibration runs once and is cached for all of them."""

    def __init__(self, float_model: onnx.ModelProto, calib: SampleSet | None, method: CalibrationMethod,
                 evalset: EvalSet, max_drop: float, workdir: Path, console: Console) -> None:
        self.float_model = float_model
        self.calib = calib
        self.method = method
        self.evalset = evalset
        self.max_drop = max_drop
        self.cache = workdir / "calibration.json"
        self.console = console

    def build(self, recipe: Recipe, exclude: set[str] | None = None) -> Variant:
        """The variant for `recipe`; INT8 variants go through the accuracy loop."""
        model = self._produce(recipe, exclude or set())
        variant = Variant(recipe, model, self.score(model), kept_float=sorted(exclude or ()))
        if recipe.precision == "int8":
            variant.history.append({"kept_float": len(variant.kept_float), "drop": variant.accuracy.drop})
            if variant.accuracy.drop > self.max_drop:
                self._keep_sensitive_float(variant)
        return variant

    def score(self, model: onnx.ModelProto) -> Accuracy:
        """Accuracy of `model` on the evaluation set against the float model."""
        evalset = self.evalset
        return measure(evalset.metrics, evalset.reference, run_outputs(model, evalset.samples), evalset.labels)

    def _produce(self, recipe: Recipe, exclude: set[str]) -> onnx.ModelProto:
        if recipe.precision == "fp32":
            return self.float_model
        if recipe.precision == "fp16":
            return convert_fp16(self.float_model, recipe, exclude)
        if recipe.precision == "dynamic":
            return quantize_dynamic_weights(self.float_model, recipe)
        return self._int8(recipe, exclude)

    def _int8(self, recipe: Recipe, exclude: set[str]) -> onnx.ModelProto:
        if self.cache.is_file():
            return quantize_int8(self.float_model, recipe, None, self.method, self.cache, exclude)
        assert self.calib is not None, "int8 planned without calibration samples"
        with Progress(console=self.console, transient=True) as progress:
            reader = StreamingReader(self.calib, progress, f"calibrating ({len(self.calib)} samples)")
            return quantize_int8(self.float_model, recipe, reader, self.method, self.cache, exclude)

    def _keep_sensitive_float(self, variant: Variant) -> None:
        """Keep the most sensitive activations float a few at a time while that helps."""
        sens = self.evalset.samples.head(_SENSITIVITY_SAMPLES)
        variant.errors = tensor_errors(self.float_model, variant.model, sens)
        ranked = sorted(variant.errors, key=lambda e: e.qdq_sqnr)
        kept, stale = set(variant.kept_float), 0
        steps = [ranked[i:i + _TENSORS_PER_STEP] for i in range(0, len(ranked), _TENSORS_PER_STEP)]
        for step in steps[:_MAX_STEPS]:
            trial = kept | {n for e in step for n in e.nodes}
            if trial == kept:
                continue
            model = self._int8(variant.recipe, trial)
            if not is_quantized(model):  # all float is not a quantized model: report failure instead
                variant.history.append({"kept_float": len(trial), "stopped": "would leave nothing quantized"})
                break
            accuracy = self.score(model)
            helped = accuracy.drop < variant.accuracy.drop - 1e-6
            variant.history.append({"kept_float": len(trial), "drop": accuracy.drop, "kept": helped,
                                    "tensors": [e.tensor for e in step]})
            if not helped:
                stale += 1
                if stale >= _PATIENCE:
                    break
                continue
            kept, stale = trial, 0
            variant.model, variant.accuracy, variant.kept_float = model, accuracy, sorted(trial)
            if accuracy.drop <= self.max_drop:
                break

    def rebuild(self, variant: Variant, exclude: set[str]) -> None:
        """Re-build `variant` with `exclude` kept float32 (used to remove target fallbacks)."""
        if variant.recipe.precision == "fp16":  # what the converter can keep float across If/Loop/Scan
            exclude = fp16_block_list(self.float_model.graph, exclude)
        variant.model = self._produce(variant.recipe, exclude)
        variant.accuracy = self.score(variant.model)
        variant.kept_float = sorted(exclude)
        variant.history.append({"kept_float": len(exclude), "drop": variant.accuracy.drop, "for": "target"})
