"""`edgectl quantize` end to end: load, plan per target, build variants, check, measure, choose, write."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import onnx
from rich.console import Console

from agent.errors import InternalError, ModelError, OperationFailed, UserError
from agent.modelcheck import load_model_checked
from quantize.calibration import method_named
from quantize.evaluate import load_labels, run_outputs
from quantize.latency import measure_latency
from quantize.metrics import choose_metrics, parse_metric_option
from quantize.opset import PER_CHANNEL_OPSET, QDQ_OPSET, Converter, default_opset, upgrade_opset
from quantize.passes import lift_constants, name_nodes, prepare
from quantize.plan import Plan, plan_recipes
from quantize.recipe import CpuFeatures, Mode, Recipe
from quantize.report import QuantizeReport
from quantize.rules import format_violations, is_quantized, weight_tensors
from quantize.samples import InputSpec, SampleSet, input_specs
from quantize.sensitivity import tensor_errors
from quantize.shapes import dynamic_inputs, fix_input_shapes, parse_static_shapes, unloadable_with_branches
from quantize.target_check import TargetCheck, check_target
from quantize.variants import EvalSet, Variant, VariantBuilder

__all__ = ["QuantizeOutcome", "QuantizeRequest", "attempt_quantize", "run_quantize"]

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
    static_shape: tuple[str, ...] = ()  # NAME=1x3x224x224, for inputs with dynamic dims
    metric: tuple[str, ...] = ()  # METRIC or OUTPUT=METRIC (quantize.metrics); auto per output otherwise
    convert_opset: Converter | None = None  # seam: onnx.version_converter.convert_version by default
    registry: Any = field(default=None, compare=False)  # seam: the agent backend registry (EP -> family)


@dataclass(frozen=True)
class QuantizeOutcome:
    """A finished run: its report, and the exit-5 failure that forbids writing the model, if any."""

    report: QuantizeReport
    failure: OperationFailed | None = None

    @property
    def written(self) -> bool:
        """True when the chosen model may be written (the report then carries it)."""
        return self.failure is None


def run_quantize(request: QuantizeRequest, console: Console) -> QuantizeReport:
    """The report carrying the model to write at request.output; OperationFailed (exit 5) when none may be."""
    outcome = attempt_quantize(request, console)
    if outcome.failure is not None:
        raise outcome.failure
    return outcome.report


def attempt_quantize(request: QuantizeRequest, console: Console | None = None) -> QuantizeOutcome:
    """Run the pipeline and return its report even when the result must not be written (budget, target check).

    Writes nothing and, without a console, prints nothing. Bad input still raises UserError or ModelError
    (exit 2), as `run_quantize` does.
    """
    import targets  # host-only package, imported here so `quantize` stays importable on its own

    console = console if console is not None else Console(quiet=True)
    asked_metrics = parse_metric_option(request.metric)
    asked_shapes = parse_static_shapes(request.static_shape)
    notes: list[str] = []
    profile = _load_profile(request.target, notes)
    model = _load_float(request.model, notes)
    cpu = CpuFeatures.from_cpuinfo(request.cpuinfo)
    plan = plan_recipes(request.mode, profile, cpu, keep_io_types=not request.fp16_io, notes=notes,
                        registry=request.registry)
    plan = _int8_reachable(request.model, model, plan, notes)
    recipes = plan.recipes
    needs_calib = any(r.precision == "int8" for r in recipes)
    model = _static(request, model, asked_shapes, needs_calib, notes)
    float_model, recipes = _prepared(model, recipes, notes, request.convert_opset) if needs_calib else (model, recipes)
    specs = input_specs(float_model)
    calib = _calibration(request, specs, console, notes) if needs_calib else None
    evalset = _evalset(request, float_model, specs, calib, notes, asked_metrics)
    with tempfile.TemporaryDirectory(prefix="edgectl-quantize-") as tmp:
        builder = VariantBuilder(float_model, calib, method_named(request.method), evalset,
                                 request.max_drop, Path(tmp), console)
        variants = [builder.build(r) for r in recipes]
        before = targets.analyse(float_model, profile)
        checks = {v.name: check_target(float_model, v, profile, builder, before) for v in variants}
    if request.per_node_errors:
        for v in variants:
            if v.recipe.precision == "int8" and not v.errors:
                v.errors = tensor_errors(float_model, v.model, evalset.samples.head(8))
    _check_formats(variants, notes)
    latency, lat_notes = _latency(request, variants, evalset)
    chosen = _choose(plan.pick_fastest, request.max_drop, variants, latency, checks, notes)
    report = QuantizeReport.build(request, profile.name, cpu, variants, chosen, checks, latency,
                                  notes + lat_notes, evalset.source, _size(model))
    failure = _worse_target(chosen, checks[chosen.name], profile.name, request.output)
    if failure is None and chosen.accuracy.drop > request.max_drop:
        failure = OperationFailed(
            f"accuracy budget not met: best {chosen.accuracy.metric} drop {chosen.accuracy.drop:.2f} points "
            f"> --max-drop {request.max_drop} (kept {len(chosen.kept_float)} nodes float); nothing written to "
            f"{request.output}")
    return QuantizeOutcome(report, failure) if failure else QuantizeOutcome(report.with_model(chosen.model))


def _load_profile(name: str, notes: list[str]) -> Any:
    """The target profile; `coreml` names the CoreML format the EP runs fastest (MLProgram, fp16)."""
    import targets

    if name == "coreml" and "coreml" not in {p.name for p in targets.list_profiles()}:
        notes.append("target coreml: the coreml-mlprogram profile (MLProgram is the CoreML format that runs fp16)")
        return targets.load_profile("coreml-mlprogram")
    return targets.load_profile(name)


def _worse_target(chosen: Variant, check: TargetCheck, target: str, output: Path) -> OperationFailed | None:
    """Exit 5 rather than write a model that runs worse on the target than its float input."""
    if check.fixed:
        return None
    before, after = check.before, check.after
    return OperationFailed(
        f"target check failed: {chosen.name} runs worse on {target} than the float model "
        f"({before['accelerator_partitions']} -> {after['accelerator_partitions']} accelerator partitions, "
        f"verdict {before['verdict']} -> {after['verdict']}, {len(check.added_fallbacks)} nodes added to CPU"
        f"{'; ' + after['reason'] if after.get('verdict') == 'unknown' else ''}) "
        f"even with {len(check.kept_float)} nodes kept float; nothing written to {output}")


def _load_float(path: Path, notes: list[str]) -> onnx.ModelProto:
    model = load_model_checked(path)
    already = is_quantized(model)
    if already:
        raise ModelError(f"{path}: model is already quantized (has {', '.join(already)}); quantize the float model")
    lifted = lift_constants(model)
    if lifted:
        notes.append(f"{lifted} Constant nodes moved to initializers (weights exported as Constant nodes)")
    if not any(t.data_type == onnx.TensorProto.FLOAT for _, t in weight_tensors(model.graph)):
        raise ModelError(f"{path}: no float32 weights to quantize (neither initializers nor Constant nodes)")
    return name_nodes(model)


def _int8_reachable(path: Path, model: onnx.ModelProto, plan: Plan, notes: list[str]) -> Plan:
    """The plan without INT8 when every float weight sits inside If/Loop/Scan branches (or ModelError).

    onnxruntime's static quantizer works on the top-level graph only (its EnableSubgraph is for dynamic
    quantization); fp16 conversion descends into branches, so fp16 and float recipes stay.
    """
    if not any(r.precision == "int8" for r in plan.recipes):
        return plan
    if any(t.data_type == onnx.TensorProto.FLOAT for depth, t in weight_tensors(model.graph) if depth == 0):
        return plan
    why = ("every float32 weight is inside control-flow subgraphs (If/Loop/Scan branches), which "
           "onnxruntime's static INT8 quantizer does not reach")
    kept = [r for r in plan.recipes if r.precision != "int8"]
    if plan.pick_fastest and kept:
        notes.append(f"INT8 not built: {why}")
        return replace(plan, recipes=kept)
    raise ModelError(f"{path}: cannot quantize to INT8: {why}; use --mode fp16, or a target whose format is fp16")


def _static(request: QuantizeRequest, model: onnx.ModelProto, asked: dict[str, list[int]], needs_calib: bool,
            notes: list[str]) -> onnx.ModelProto:
    """The model with static input shapes: --static-shape, else the first --calib sample, else batch 1."""
    if asked:
        model, note = fix_input_shapes(model, asked, "--static-shape")
        notes.append(note)
    dynamic = dynamic_inputs(model)
    if not dynamic:
        return model
    sample_dir = request.calib_dir if needs_calib and request.calib_dir else request.eval_dir or request.calib_dir
    if sample_dir is not None:
        first = SampleSet.from_dir(sample_dir, input_specs(model), request.preprocess).first_shapes()
        fixed, note = fix_input_shapes(model, {s.name: first[s.name] for s in dynamic if s.name in first},
                                       f"from the first sample in {sample_dir}")
        refused = unloadable_with_branches(fixed)
        if refused is not None:  # silero-vad v5: its untaken branch cannot take the sample's fixed shape
            notes.append(f"inputs kept dynamic: with the shapes of the first sample in {sample_dir}, "
                         f"onnxruntime cannot load the model ({refused})")
            return model
        model = fixed
        notes.append(note)
        dynamic = dynamic_inputs(model)
    if all(d is not None for s in dynamic for d in s.shape[1:]):  # only the batch is dynamic: use 1
        if dynamic:
            model, note = fix_input_shapes(model, {s.name: [1, *s.shape[1:]] for s in dynamic},  # type: ignore[list-item]
                                           "dynamic batch set to 1")
            notes.append(note)
        return model
    spec = next(s for s in dynamic if any(d is None for d in s.shape[1:]))
    letters = iter("HWDEFG")
    hint = "x".join("1" if i == 0 and d is None else next(letters, "N") if d is None else str(d)
                    for i, d in enumerate(spec.shape))
    raise UserError(f"input '{spec.name}' has dynamic dims {spec.describe()}: give --static-shape {spec.name}={hint} "
                    "with numbers, or --calib DIR with samples of the shape to use")


def _prepared(model: onnx.ModelProto, recipes: list[Recipe], notes: list[str],
              convert: Converter | None) -> tuple[onnx.ModelProto, list[Recipe]]:
    """Opset raised for per-channel QDQ, or kept (per-tensor QDQ) when one op cannot convert; then ORT pre-processing."""
    try:
        model, note = upgrade_opset(model, PER_CHANNEL_OPSET, *([convert] if convert else []))
    except ModelError as exc:
        current = default_opset(model)
        if current >= QDQ_OPSET:
            note = f"{exc}; kept opset {current}: per-channel weights off, per-tensor QDQ"
        else:
            model, raised = upgrade_opset(model, QDQ_OPSET, *([convert] if convert else []))  # ModelError if impossible
            note = f"{exc}; {raised}: per-channel weights off, per-tensor QDQ"
        recipes = [_per_tensor(r) for r in recipes]
    if note:
        notes.append(note)
    model, prep_note = prepare(model)
    if prep_note:
        notes.append(prep_note)
    return model, recipes


def _per_tensor(recipe: Recipe) -> Recipe:
    return replace(recipe, per_channel=False) if recipe.precision == "int8" else recipe


def _calibration(request: QuantizeRequest, specs: list[InputSpec], console: Console, notes: list[str]) -> SampleSet:
    if request.calib_dir is not None:
        return SampleSet.from_dir(request.calib_dir, specs, request.preprocess)
    if request.calib_synthetic > 0:
        warning = (f"WARNING: calibrating on {request.calib_synthetic} synthetic random samples: the "
                   "quantization ranges, and so the accuracy on real data, are UNKNOWN")
        console.print(f"[bold red]{warning}[/]")
        notes.append(warning)
        return SampleSet.synthetic_set(specs, request.calib_synthetic)
    raise UserError("int8 needs calibration data: give --calib DIR (or --calib-synthetic N to accept unknown accuracy)")


def _evalset(request: QuantizeRequest, model: onnx.ModelProto, specs: list[InputSpec], calib: SampleSet | None,
             notes: list[str], asked: dict[str, str]) -> EvalSet:
    labels = None
    if request.eval_dir is not None:
        samples = SampleSet.from_dir(request.eval_dir, specs, request.preprocess, limit=request.max_eval)
        labels = load_labels(request.eval_dir, len(SampleSet.from_dir(request.eval_dir, specs, request.preprocess)))
        labels = None if labels is None else labels[: len(samples)]
        source = f"{request.eval_dir} ({len(samples)} samples{', labels' if labels is not None else ''})"
    elif calib is not None or request.calib_dir is not None:
        # An fp16-only plan loads no calibration set, but the --calib samples are still the data to score on
        # (random ones can drive a Loop's count or an If's branch where real inputs never go).
        samples = (calib if calib is not None else _samples(request.calib_dir, specs, request.preprocess)).head(
            _EVAL_FROM_CALIB)
        notes.append("no --eval: accuracy measured against the float model on calibration samples (optimistic)")
        source = f"calibration samples ({len(samples)})"
    else:
        samples = SampleSet.synthetic_set(specs, 16)
        notes.append("no --eval or --calib: accuracy measured against the float model on 16 random samples")
        source = f"synthetic samples ({len(samples)})"
    reference = run_outputs(model, samples)
    metrics = choose_metrics([o.name for o in model.graph.output], reference[0], asked)
    notes.append("metric per output: " + "; ".join(f"{m.output}: {m.title} ({m.why})" for m in metrics))
    return EvalSet(samples, labels, reference, source, metrics)


def _samples(folder: Path | None, specs: list[InputSpec], preprocess: Path | None) -> SampleSet:
    assert folder is not None
    return SampleSet.from_dir(folder, specs, preprocess, limit=_EVAL_FROM_CALIB)


def _check_formats(variants: list[Variant], notes: list[str]) -> None:
    for variant in variants:
        problems = format_violations(variant.model, variant.recipe, variant.kept_float)
        if problems and variant.kept_float and _all_float(variant):
            notes.append(f"{variant.name}: every quantizable node had to stay float; it is the float model")
            continue
        if problems:
            raise InternalError(f"{variant.name} breaks the {variant.recipe.family.value} format: {problems[0]}")


def _all_float(variant: Variant) -> bool:
    """True when nothing of the variant is in its reduced precision (no QDQ node, or no float16 weight)."""
    if variant.recipe.precision == "fp16":
        return not any(t.data_type == onnx.TensorProto.FLOAT16 for _, t in weight_tensors(variant.model.graph))
    return not is_quantized(variant.model)


def _latency(request: QuantizeRequest, variants: list[Variant], evalset: EvalSet) -> tuple[dict[str, Any], list[str]]:
    if not request.measure:
        return {}, ["latency not measured (--no-measure)"]
    feeds = next(iter(evalset.samples))
    try:
        return measure_latency({v.name: v.model for v in variants}, feeds)
    except Exception as exc:  # an optional measurement: its failure is a note, never the run's failure
        return {}, [f"latency not measured: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"]


def _choose(pick_fastest: bool, max_drop: float, variants: list[Variant], latency: dict[str, Any],
            checks: dict[str, TargetCheck], notes: list[str]) -> Variant:
    """The fastest variant within budget and target check (the float input always is), else the one asked for."""
    if pick_fastest:
        within = [v for v in variants if v.accuracy.drop <= max_drop and checks[v.name].fixed] or variants[:1]
        # A variant must beat the float input by a margin, not by measurement noise.
        chosen = min(within, key=lambda v: _ms(latency, v.name) * (1.0 if v.name == "float" else _MARGIN))
        for v in variants:
            if v.accuracy.drop > max_drop:
                notes.append(f"{v.name} rejected: {v.accuracy.metric} drop {v.accuracy.drop:.2f} > {max_drop}")
            elif not checks[v.name].fixed:
                notes.append(f"{v.name} rejected: it runs worse on the target than the float model")
    else:
        chosen = variants[-1]
    base, mine = _ms(latency, "float"), _ms(latency, chosen.name)
    if chosen.name != "float" and base and mine and mine > base:
        notes.append(f"{chosen.name} is SLOWER than the float input on this host "
                     f"({mine:.3f} ms vs {base:.3f} ms with onnxruntime); the target may differ")
    return chosen


def _ms(latency: dict[str, Any], name: str) -> float:
    value = latency.get(name, {}).get("ort_ms")
    return float(value) if value is not None else float("inf")


def _size(model: onnx.ModelProto) -> int:
    return int(model.ByteSize())
