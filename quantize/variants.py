"""Build one model variant for a recipe and, for INT8, keep sensitive nodes float until the budget holds."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import onnx
from onnxruntime.quantization import CalibrationMethod
from rich.console import Console
from rich.progress import Progress

from edgecore.errors import ModelError
from quantize.budget import Accuracy
from quantize.calibration import StreamingReader
from quantize.evaluate import Outputs, run_outputs
from quantize.nncf_ptq import quantize_nncf
from quantize.openvino_ir import IrModel, export_ir, run_openvino
from quantize.passes import convert_fp16, fp16_block_list, quantize_dynamic_weights, quantize_int8
from quantize.recipe import Recipe
from quantize.reference import EvalSet
from quantize.rules import is_quantized
from quantize.samples import SampleSet
from quantize.sensitivity import TensorError, tensor_errors

__all__ = ["Variant", "VariantBuilder"]

_SENSITIVITY_SAMPLES = 8  # qdq_loss_debug keeps every activation of every sample in memory
_TENSORS_PER_STEP = 2
_MAX_STEPS = 10
_PATIENCE = 3  # consecutive steps that did not help before giving up


@dataclass
class Variant:
    """A produced model, its accuracy, and what the accuracy loop kept float."""

    recipe: Recipe
    model: onnx.ModelProto
    accuracy: Accuracy
    kept_float: list[str] = field(default_factory=list)
    history: list[dict[str, object]] = field(default_factory=list)
    errors: list[TensorError] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # why it must not be written (format, validity, share)
    checked: bool = False  # problems were looked for (quantize.choice.rule_out)
    ir: IrModel | None = None  # the OpenVINO IR written instead of `model` (which is then the graph it holds)

    @property
    def size(self) -> int:
        """Bytes of what would be written."""
        return self.ir.size if self.ir is not None else int(self.model.ByteSize())

    @property
    def name(self) -> str:
        """The recipe's name, e.g. int8 or int8-compute."""
        return self.recipe.name


class VariantBuilder:
    """Builds variants of one float model; INT8 calibration runs once and is cached for all of them.

    `base` is the user's model with static shapes (float and fp16 variants start there); `prepared` is
    its checked rewrite for QDQ (quantize.reference.prepare_for_int8), where INT8 and dynamic start.
    """

    def __init__(self, base: onnx.ModelProto, prepared: onnx.ModelProto, calib: SampleSet | None,
                 method: CalibrationMethod, evalset: EvalSet, workdir: Path, console: Console) -> None:
        self.base = base
        self.prepared = prepared
        self.calib = calib
        self.method = method
        self.evalset = evalset
        self.cache = workdir / "calibration.json"
        self.console = console

    def source(self, recipe: Recipe) -> onnx.ModelProto:
        """The float model `recipe` is built from."""
        return self.prepared if recipe.precision in ("int8", "dynamic") else self.base

    def build(self, recipe: Recipe, exclude: set[str] | None = None) -> Variant:
        """The variant for `recipe`; INT8 variants go through the accuracy loop."""
        if recipe.container == "openvino-ir":
            ir = self._nncf() if recipe.precision == "int8" else export_ir(self.base, compress_to_fp16=True)
            return Variant(recipe, self.base, self.score_outputs(run_openvino(ir, self._names(), self.evalset.samples)),
                           ir=ir)
        model = self._produce(recipe, exclude or set())
        variant = Variant(recipe, model, self.score(model), kept_float=sorted(exclude or ()))
        if recipe.precision == "int8":
            variant.history.append(_step(variant.kept_float, variant.accuracy))
            if not variant.accuracy.ok:
                self._keep_sensitive_float(variant)
        return variant

    def score(self, model: onnx.ModelProto) -> Accuracy:
        """Accuracy of `model` on the evaluation set against the user's model."""
        return self.score_outputs(run_outputs(model, self.evalset.samples))

    def score_outputs(self, outputs: Outputs) -> Accuracy:
        """Accuracy of a variant's outputs on the evaluation set against the user's model."""
        return self.evalset.score(outputs)

    def _nncf(self) -> IrModel:
        assert self.calib is not None, "int8 planned without calibration samples"
        with Progress(console=self.console, transient=True) as progress:
            progress.add_task(f"NNCF post-training quantization ({len(self.calib)} samples)", total=None)
            return quantize_nncf(self.base, self.calib)

    def _names(self) -> list[str]:
        return [m.output for m in self.evalset.metrics]

    def _produce(self, recipe: Recipe, exclude: set[str]) -> onnx.ModelProto:
        if recipe.precision == "fp32":
            return self.base
        if recipe.precision == "fp16":
            return convert_fp16(self.base, recipe, exclude)
        if recipe.precision == "dynamic":
            return quantize_dynamic_weights(self.prepared, recipe)
        return self._int8(recipe, exclude)

    def _int8(self, recipe: Recipe, exclude: set[str]) -> onnx.ModelProto:
        if self.cache.is_file():
            return quantize_int8(self.prepared, recipe, None, self.method, self.cache, exclude)
        assert self.calib is not None, "int8 planned without calibration samples"
        with Progress(console=self.console, transient=True) as progress:
            reader = StreamingReader(self.calib, progress, f"calibrating ({len(self.calib)} samples)")
            return quantize_int8(self.prepared, recipe, reader, self.method, self.cache, exclude)

    def _keep_sensitive_float(self, variant: Variant) -> None:
        """Keep the most sensitive activations float a few at a time while that helps."""
        sens = self.evalset.samples.head(_SENSITIVITY_SAMPLES)
        try:
            variant.errors = tensor_errors(self.prepared, variant.model, sens)
        except ModelError as exc:  # the loop cannot rank tensors: the variant stays as built, the budget decides
            variant.history.append({"stopped": f"per-tensor errors not measured: {exc}"})
            return
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
            helped = accuracy.share < variant.accuracy.share - 1e-9
            variant.history.append({**_step(trial, accuracy), "kept": helped, "tensors": [e.tensor for e in step]})
            if not helped:
                stale += 1
                if stale >= _PATIENCE:
                    break
                continue
            kept, stale = trial, 0
            variant.model, variant.accuracy, variant.kept_float = model, accuracy, sorted(trial)
            if accuracy.ok:
                break

    def rebuild(self, variant: Variant, exclude: set[str]) -> None:
        """Re-build `variant` with `exclude` kept float32 (used to remove target fallbacks)."""
        if variant.recipe.precision == "fp16":  # what the converter can keep float across If/Loop/Scan
            exclude = fp16_block_list(self.base.graph, exclude)
        variant.model = self._produce(variant.recipe, exclude)
        variant.accuracy = self.score(variant.model)
        variant.kept_float = sorted(exclude)
        variant.history.append({**_step(exclude, variant.accuracy), "for": "target"})


def _step(kept: set[str] | list[str], accuracy: Accuracy) -> dict[str, object]:
    """One entry of the accuracy loop's history."""
    worst = accuracy.worst
    return {"kept_float": len(kept), "output": worst.output, "value": worst.value, "unit": worst.unit,
            "budget_share": round(accuracy.share, 4)}
