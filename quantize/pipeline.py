"""`edgectl quantize` end to end: load, plan per target, build variants, check, measure, choose, write."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import onnx
from rich.console import Console

from agent.errors import InternalError, ModelError, OperationFailed, UserError
from agent.modelcheck import load_model_checked
from quantize.calibration import method_named
from quantize.evaluate import load_labels, run_outputs
from quantize.latency import measure_latency
from quantize.opset import PER_CHANNEL_OPSET, QDQ_OPSET, upgrade_opset
from quantize.passes import name_nodes, prepare
from quantize.plan import plan_recipes
from quantize.recipe import CpuFeatures, Mode, Recipe
from quantize.report import QuantizeReport
from quantize.rules import format_violations, is_quantized
from quantize.samples import SampleSet, input_specs
from quantize.sensitivity import tensor_errors
from quantize.target_check import check_target
from quantize.variants import EvalSet, Variant, VariantBuilder

__all__ = ["QuantizeRequest", "run_quantize"]

_MARGIN = 1.03  # auto keeps the float input unless a variant is at least 3% faster
_EVAL_FROM_CALIB = 64  # samples taken from the calibration set when no --eval is given


@dataclass(frozen=True)
class QuantizeRequest:
    """Everything `edgectl quantize` was asked to do."""

    model: Path
    target: str
    output: Path
    mode: Mode = Mode.AUTO
    calib_dir: Path | None = None
    calib_synthetic: int = 0
    preprocess: Path | None = None
    method: str = "minmax"
    eval_dir: Path | None = None
    max_drop: float = 1.0
    fp16_io: bool = False
    max_eval: int = 256
    cpuinfo: Path = Path("/proc/cpuinfo")
    measure: bool = True
    per_node_errors: bool = False  # compute the per-tensor error plot data even when the budget holds


def run_quantize(request: QuantizeRequest, console: Console) -> QuantizeReport:
    """Produce the model at request.output and return the report; nothing is written on failure."""
    import targets  # host-only package, imported here so `quantize` stays importable on its own

    profile = targets.load_profile(request.target)
    model = _load_float(request.model)
    notes: list[str] = []
    cpu = CpuFeatures.from_cpuinfo(request.cpuinfo)
    plan = plan_recipes(request.mode, profile, cpu, keep_io_types=not request.fp16_io, notes=notes)
    recipes = plan.recipes
    needs_calib = any(r.precision == "int8" for r in recipes)
    float_model, recipes = _prepared(model, recipes, notes) if needs_calib else (model, recipes)
    specs = input_specs(float_model)
    calib = _calibration(request, specs, console, notes) if needs_calib else None
    evalset = _evalset(request, float_model, specs, calib, notes)
    with tempfile.TemporaryDirectory(prefix="edgectl-quantize-") as tmp:
        builder = VariantBuilder(float_model, calib, method_named(request.method), evalset,
                                 request.max_drop, Path(tmp), console)
        variants = [builder.build(r) for r in recipes]
        checks = {v.name: check_target(float_model, v, profile, builder) for v in variants}
    if request.per_node_errors:
        for v in variants:
            if v.recipe.precision == "int8" and not v.errors:
                v.errors = tensor_errors(float_model, v.model, evalset.samples.head(8))
    _check_formats(variants, notes)
    latency, lat_notes = _latency(request, variants, evalset)
    chosen = _choose(plan.pick_fastest, request.max_drop, variants, latency, notes)
    report = QuantizeReport.build(request, profile.name, cpu, variants, chosen, checks, latency,
                                  notes + lat_notes, evalset.source, _size(model))
    if chosen.accuracy.drop > request.max_drop:
        raise OperationFailed(
            f"accuracy budget not met: best {chosen.accuracy.metric} drop {chosen.accuracy.drop:.2f} points "
            f"> --max-drop {request.max_drop} (kept {len(chosen.kept_float)} nodes float); nothing written to "
            f"{request.output}")
    return report.with_model(chosen.model)


def _load_float(path: Path) -> onnx.ModelProto:
    model = load_model_checked(path)
    already = is_quantized(model)
    if already:
        raise ModelError(f"{path}: model is already quantized (has {', '.join(already)}); quantize the float model")
    if not any(t.data_type == onnx.TensorProto.FLOAT for t in model.graph.initializer):
        raise ModelError(f"{path}: no float32 weights to quantize")
    return name_nodes(model)


def _prepared(model: onnx.ModelProto, recipes: list[Recipe], notes: list[str]) -> tuple[onnx.ModelProto, list[Recipe]]:
    """Opset raised for per-channel QDQ (or per-tensor fallback explained), then ORT pre-processing."""
    try:
        model, note = upgrade_opset(model, PER_CHANNEL_OPSET)
    except ModelError as exc:
        model, note = upgrade_opset(model, QDQ_OPSET)  # raises when even QDQ is impossible
        notes.append(f"{exc}; per-channel weights off, per-tensor QDQ at opset >= {QDQ_OPSET}")
        recipes = [_per_tensor(r) for r in recipes]
    if note:
        notes.append(note)
    model, prep_note = prepare(model)
    if prep_note:
        notes.append(prep_note)
    return model, recipes


def _per_tensor(recipe: Recipe) -> Recipe:
    return replace(recipe, per_channel=False) if recipe.precision == "int8" else recipe


def _calibration(request: QuantizeRequest, specs: list, console: Console, notes: list[str]) -> SampleSet:
    if request.calib_dir is not None:
        return SampleSet.from_dir(request.calib_dir, specs, request.preprocess)
    if request.calib_synthetic > 0:
        warning = (f"WARNING: calibrating on {request.calib_synthetic} synthetic random samples: the "
                   "quantization ranges, and so the accuracy on real data, are UNKNOWN")
        console.print(f"[bold red]{warning}[/]")
        notes.append(warning)
        return SampleSet.synthetic_set(specs, request.calib_synthetic)
    raise UserError("int8 needs calibration data: give --calib DIR (or --calib-synthetic N to accept unknown accuracy)")


def _evalset(request: QuantizeRequest, model: onnx.ModelProto, specs: list, calib: SampleSet | None,
             notes: list[str]) -> EvalSet:
    if request.eval_dir is not None:
        samples = SampleSet.from_dir(request.eval_dir, specs, request.preprocess, limit=request.max_eval)
        labels = load_labels(request.eval_dir, len(SampleSet.from_dir(request.eval_dir, specs, request.preprocess)))
        source = f"{request.eval_dir} ({len(samples)} samples{', labels' if labels is not None else ''})"
        return EvalSet(samples, None if labels is None else labels[: len(samples)], run_outputs(model, samples), source)
    samples = calib.head(_EVAL_FROM_CALIB) if calib is not None else SampleSet.synthetic_set(specs, 16)
    notes.append("no --eval: accuracy measured against the float model on calibration samples (optimistic)")
    return EvalSet(samples, None, run_outputs(model, samples), f"calibration samples ({len(samples)})")


def _check_formats(variants: list[Variant], notes: list[str]) -> None:
    for variant in variants:
        problems = format_violations(variant.model, variant.recipe)
        if problems and variant.kept_float and not is_quantized(variant.model):
            notes.append(f"{variant.name}: every quantizable node had to stay float; it is the float model")
            continue
        if problems:
            raise InternalError(f"{variant.name} breaks the {variant.recipe.family.value} format: {problems[0]}")


def _latency(request: QuantizeRequest, variants: list[Variant], evalset: EvalSet) -> tuple[dict, list[str]]:
    if not request.measure:
        return {}, ["latency not measured (--no-measure)"]
    feeds = next(iter(evalset.samples))
    return measure_latency({v.name: v.model for v in variants}, feeds)


def _choose(pick_fastest: bool, max_drop: float, variants: list[Variant], latency: dict,
            notes: list[str]) -> Variant:
    """The fastest variant within budget (the float input always is), else the one variant asked for."""
    if pick_fastest:
        within = [v for v in variants if v.accuracy.drop <= max_drop]
        # A variant must beat the float input by a margin, not by measurement noise.
        chosen = min(within, key=lambda v: _ms(latency, v.name) * (1.0 if v.name == "float" else _MARGIN))
        for v in variants:
            if v not in within:
                notes.append(f"{v.name} rejected: {v.accuracy.metric} drop {v.accuracy.drop:.2f} > {max_drop}")
    else:
        chosen = variants[-1]
    base, mine = _ms(latency, "float"), _ms(latency, chosen.name)
    if chosen.name != "float" and base and mine and mine > base:
        notes.append(f"{chosen.name} is SLOWER than the float input on this host "
                     f"({mine:.3f} ms vs {base:.3f} ms with onnxruntime); the target may differ")
    return chosen


def _ms(latency: dict, name: str) -> float:
    value = latency.get(name, {}).get("ort_ms")
    return float(value) if value is not None else float("inf")


def _size(model: onnx.ModelProto) -> int:
    return model.ByteSize()
