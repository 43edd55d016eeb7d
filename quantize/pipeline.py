"""`edgectl quantize` end to end: load, plan per target, build variants, check, measure, choose, write."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import onnx
from rich.console import Console

from edgecore.errors import ModelError, OperationFailed, UserError
from quantize.budget import Accuracy, Budget
from quantize.calibration import method_named
from quantize.choice import choose
from quantize.evaluate import run_outputs
from quantize.latency import measure_latency
from quantize.metrics import parse_metric_option
from quantize.openvino_ir import IrModel, compile_cpu, run_openvino
from quantize.opset import Converter
from quantize.plan import Plan, plan_recipes
from quantize.recipe import CpuFeatures, Family, Mode, Recipe
from quantize.reference import EvalSet, eval_samples, prepare_for_int8, reference_set
from quantize.report import QuantizeReport
from quantize.rules import weight_tensors
from quantize.samples import InputSpec, SampleSet, input_specs
from quantize.sensitivity import tensor_errors
from quantize.shapes import parse_static_shapes
from quantize.source import UserModel, load_user_model, static_base
from quantize.target_check import check_target
from quantize.variants import Variant, VariantBuilder

__all__ = ["QuantizeOutcome", "QuantizeRequest", "attempt_quantize", "run_quantize", "verify_model"]


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
    max_drop: float = 1.0  # points, for agreement metrics (quantize.budget)
    min_db: float = 30.0  # dB, for SQNR/PSNR metrics
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
    notes: list[str] = []
    profile = _load_profile(request.target, notes)
    user = load_user_model(request.model, notes)
    cpu = CpuFeatures.from_cpuinfo(request.cpuinfo)
    plan = _plan(request, profile, cpu, user, notes)
    base, calib, evalset = _evaluation(request, user, _needs_calib(plan), console, notes)
    recipes, prepared, rewrite = plan.recipes, base, None
    if any(r.precision in ("int8", "dynamic") for r in recipes):
        prepared, recipes, rewrite = prepare_for_int8(base, recipes, evalset, notes, request.convert_opset)
    with tempfile.TemporaryDirectory(prefix="edgectl-quantize-") as tmp:
        builder = VariantBuilder(base, prepared, calib, method_named(request.method), evalset, Path(tmp), console)
        variants = _build(builder, recipes, request.mode, notes)
        before = {id(m): targets.analyse(m, profile) for m in {id(base): base, id(prepared): prepared}.values()}
        checks = {v.name: check_target(builder.source(v.recipe), v, profile, builder,
                                       before[id(builder.source(v.recipe))]) for v in variants}
    _per_node_errors(request, variants, prepared, evalset)
    if plan.family is Family.OPENVINO:
        _openvino_loads(base, profile.name, notes)
    latency_key = "openvino_ms" if plan.family is Family.OPENVINO else "ort_ms"
    latency, lat_notes = _latency(request, variants, evalset, latency_key)
    choice = choose(variants, plan.pick_fastest, request.mode is Mode.AUTO, latency, latency_key, checks,
                    plan.family, profile.name, request.output, notes)
    report = QuantizeReport.build(request, profile.name, cpu, variants, choice.variant, checks, latency,
                                  notes + lat_notes, evalset, rewrite, _size(user.original), evalset.budget)
    if choice.failure is not None:
        return QuantizeOutcome(report, choice.failure)
    return QuantizeOutcome(report.with_model(choice.variant.model, choice.variant.ir))


def verify_model(request: QuantizeRequest, candidate: onnx.ModelProto | IrModel) -> Accuracy:
    """`candidate` judged as the pipeline judges a variant: against the request's model on its evaluation samples.

    For a file made elsewhere (or altered after the run): the same reference, metrics and budget.
    """
    user = load_user_model(request.model, [])
    plan = _plan(request, _load_profile(request.target, []), CpuFeatures.from_cpuinfo(request.cpuinfo), user, [])
    _, _, evalset = _evaluation(request, user, _needs_calib(plan), Console(quiet=True), [])
    names = [m.output for m in evalset.metrics]
    outputs = run_openvino(candidate, names, evalset.samples) if isinstance(candidate, IrModel) else \
        run_outputs(candidate, evalset.samples)
    return evalset.score(outputs)


def _plan(request: QuantizeRequest, profile: Any, cpu: CpuFeatures, user: UserModel, notes: list[str]) -> Plan:
    plan = plan_recipes(request.mode, profile, cpu, keep_io_types=not request.fp16_io, notes=notes,
                        registry=request.registry)
    return _already_quantized(user, request.mode, _int8_reachable(request.model, user.base, plan, notes), notes)


def _needs_calib(plan: Plan) -> bool:
    return any(r.precision == "int8" for r in plan.recipes)


def _evaluation(request: QuantizeRequest, user: UserModel, needs_calib: bool, console: Console,
                notes: list[str]) -> tuple[onnx.ModelProto, SampleSet | None, EvalSet]:
    """The base model at static shapes, the calibration set (when INT8 needs one) and the user's model's reference."""
    sample_dir = request.calib_dir if needs_calib and request.calib_dir else request.eval_dir or request.calib_dir
    base = static_base(user.base, parse_static_shapes(request.static_shape), sample_dir, request.preprocess, notes)
    specs = input_specs(base)
    calib = _calibration(request, specs, console, notes) if needs_calib else None
    samples, labels, source = eval_samples(request.eval_dir, request.calib_dir, calib, specs, request.preprocess,
                                           request.max_eval, notes)
    evalset = reference_set(user.original, samples, labels, source, parse_metric_option(request.metric),
                            Budget(request.max_drop, request.min_db), notes)
    return base, calib, evalset


def _build(builder: VariantBuilder, recipes: list[Recipe], mode: Mode, notes: list[str]) -> list[Variant]:
    """Every variant of the plan; under auto one that cannot be built is a note (the float model always is)."""
    variants = [builder.build(recipes[0])]
    for recipe in recipes[1:]:
        try:
            variants.append(builder.build(recipe))
        except ModelError as exc:  # the tool that builds it refused (quantize_static, OpenVINO's converter, NNCF)
            if mode is not Mode.AUTO:
                raise
            notes.append(f"{recipe.name} not built: {exc}")
    return variants


def _openvino_loads(base: onnx.ModelProto, target: str, notes: list[str]) -> None:
    """Say so when OpenVINO cannot load your model itself: no variant of it can load there either."""
    with tempfile.TemporaryDirectory(prefix="edgectl-ov-") as tmp:
        onnx.save(base, Path(tmp) / "model.onnx")
        try:
            compile_cpu(Path(tmp) / "model.onnx")
        except ModelError as exc:
            notes.append(f"WARNING: {exc} (your model): on {target} the parts OpenVINO cannot take run on onnxruntime's "
                         "CPU provider; `edgectl inspect` shows which")


def _load_profile(name: str, notes: list[str]) -> Any:
    """The target profile; `coreml` names the CoreML format the EP runs fastest (MLProgram, fp16)."""
    import targets

    if name == "coreml" and "coreml" not in {p.name for p in targets.list_profiles()}:
        notes.append("target coreml: the coreml-mlprogram profile (MLProgram is the CoreML format that runs fp16)")
        return targets.load_profile("coreml-mlprogram")
    return targets.load_profile(name)


def _already_quantized(user: UserModel, mode: Mode, plan: Plan, notes: list[str]) -> Plan:
    """A model its author already quantized: kept as it is under auto, refused for any other mode."""
    if not user.quantized_ops:
        return plan
    ops = ", ".join(user.quantized_ops)
    if mode is not Mode.AUTO:
        raise ModelError(f"{user.path}: model is already quantized (has {ops}); quantize the float model, or use "
                         "--mode auto to keep it as it is")
    notes.append(f"already quantized by its author (has {ops}): kept as it is, checked against itself")
    return replace(plan, recipes=plan.recipes[:1], pick_fastest=False)


def _int8_reachable(path: Path, model: onnx.ModelProto, plan: Plan, notes: list[str]) -> Plan:
    """The plan without INT8 when every float weight sits inside If/Loop/Scan branches (or ModelError).

    onnxruntime's static quantizer works on the top-level graph only (its EnableSubgraph is for dynamic
    quantization); fp16 conversion descends into branches, so fp16 and float recipes stay.
    """
    if not any(r.precision == "int8" for r in plan.recipes):
        return plan
    if not any(t.data_type == onnx.TensorProto.FLOAT for _, t in weight_tensors(model.graph)):
        return plan  # an already-quantized model: decided by _already_quantized
    if any(t.data_type == onnx.TensorProto.FLOAT for depth, t in weight_tensors(model.graph) if depth == 0):
        return plan
    why = ("every float32 weight is inside control-flow subgraphs (If/Loop/Scan branches), which "
           "onnxruntime's static INT8 quantizer does not reach")
    kept = [r for r in plan.recipes if r.precision != "int8"]
    if plan.pick_fastest and kept:
        notes.append(f"INT8 not built: {why}")
        return replace(plan, recipes=kept)
    raise ModelError(f"{path}: cannot quantize to INT8: {why}; use --mode fp16, or a target whose format is fp16")


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


def _per_node_errors(request: QuantizeRequest, variants: list[Variant], prepared: onnx.ModelProto,
                     evalset: EvalSet) -> None:
    """The per-tensor error plot's data (--report), even when the budget held and the loop did not run."""
    if request.per_node_errors:
        for v in variants:
            if v.recipe.precision == "int8" and v.ir is None and not v.errors:
                try:
                    v.errors = tensor_errors(prepared, v.model, evalset.samples.head(8))
                except ModelError as exc:  # the plot's data, not the result
                    v.history.append({"stopped": f"per-tensor errors not measured: {exc}"})


def _latency(request: QuantizeRequest, variants: list[Variant], evalset: EvalSet,
             key: str) -> tuple[dict[str, Any], list[str]]:
    if not request.measure:
        return {}, ["latency not measured (--no-measure)"]
    feeds = next(iter(evalset.samples))
    try:
        return measure_latency({v.name: v.ir if v.ir is not None else v.model for v in variants}, feeds, key)
    except Exception as exc:  # an optional measurement: its failure is a note, never the run's failure
        return {}, [f"latency not measured: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"]


def _size(model: onnx.ModelProto) -> int:
    return int(model.ByteSize())
