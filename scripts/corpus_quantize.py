"""The quantize part of ``./scripts/bench corpus``: per model and target, what ``edgectl quantize`` would do.

Each (model, target) runs ``quantize.pipeline.attempt_quantize`` in ``auto`` mode, which returns the
report even when the CLI would exit 5, so the table shows the outcome (written, exit 5 and why, refused
and why), the chosen variant and its format, the accuracy of every output against the budget, and each
quantized variant's onnxruntime latency over the float model's *on this host*: the target hardware
is not here, so the ratio says what the host CPU does with the format, not what the target will.
onnxruntime's warnings are captured (``quantize.runtime_log``) and counted, not printed.

The samples are written to a folder and given as both ``--calib`` and ``--eval``, so that every figure a
written result reports is recomputed independently (``quantize_check.recompute``) on exactly those samples.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from quantize_check import Check, recompute

from edgecore.errors import EdgeError, one_line
from quantize.pipeline import QuantizeRequest, attempt_quantize
from quantize.recipe import Mode
from quantize.runtime_log import capture_runtime_log

__all__ = ["DEFAULT_TARGETS", "QuantSettings", "Quantized", "describe", "markdown", "quantize_model", "warm_up"]

DEFAULT_TARGETS = ("cpu-x86", "jetson-orin", "nnapi", "myriad", "coreml-mlprogram")
Feeds = Callable[[int], dict[str, np.ndarray]]  # seed -> one sample, a value per input name


@dataclass(frozen=True)
class QuantSettings:
    """What every quantize run of one benchmark run is given."""

    targets: tuple[str, ...] = DEFAULT_TARGETS
    calib: int = 8
    max_drop: float = 1.0
    measure: bool = True
    measure_max_ms: float | None = None  # skip the latency measurement of models slower than this (float, one run)
    quantize_max_ms: float | None = None  # skip models slower than this altogether (their calibration's memory)
    min_db: float = 30.0  # the budget of SQNR/PSNR outputs


@dataclass
class Quantized:
    """One model quantized for one target."""

    model: str
    target: str
    outcome: str  # written, exit 5, refused (exit 2), exit 1 (a bug), error (a crash), skipped (too slow here)
    reason: str = ""
    data: dict[str, Any] = field(default_factory=dict)  # the quantize report's JSON figures
    wall_s: float = 0.0
    log_lines: int = 0
    calibration: str = ""
    latency_skipped: str = ""  # why this model's latency was not measured, when --measure-max-ms skipped it
    checks: list[Check] = field(default_factory=list)  # each output's reported figure and the one recomputed
    check_note: str = ""  # why the figures were not recomputed

    @property
    def agrees(self) -> bool | None:
        """Every recomputed figure within tolerance of the reported one (None: nothing recomputed)."""
        return all(c.agrees for c in self.checks) if self.checks else None


def quantize_model(name: str, path: Path, feeds: Feeds | None, static_shape: tuple[str, ...], workdir: Path,
                   settings: QuantSettings) -> list[Quantized]:
    """``name`` quantized for each target, on ``settings.calib`` samples from ``feeds`` (random ones without)."""
    calib_dir = _calibration(feeds or _synthetic(path, static_shape), workdir / f"calib-{path.stem}", settings.calib)
    source = f"{settings.calib} samples of its own inputs" if feeds else f"{settings.calib} synthetic samples"
    measure, skipped, float_ms = settings.measure, "", None
    if settings.quantize_max_ms is not None or (measure and settings.measure_max_ms is not None):
        with capture_runtime_log():
            float_ms = _float_ms(path, feeds)
    if float_ms is not None and settings.quantize_max_ms is not None and float_ms > settings.quantize_max_ms:
        why = f"float inference {float_ms:.0f} ms here > --quantize-max-ms {settings.quantize_max_ms:g}"
        return [Quantized(name, target, "skipped", why) for target in settings.targets]
    if measure and float_ms is not None and settings.measure_max_ms is not None and float_ms > settings.measure_max_ms:
        measure, skipped = False, f"float {float_ms:.0f} ms > --measure-max-ms {settings.measure_max_ms:g}"
    results = []
    for target in settings.targets:
        request = QuantizeRequest(model=path, target=target, output=workdir / f"{path.stem}.{target}.onnx",
                                  mode=Mode.AUTO, calib_dir=calib_dir, eval_dir=calib_dir,
                                  calib_synthetic=0 if calib_dir else settings.calib, max_drop=settings.max_drop,
                                  min_db=settings.min_db, measure=measure, static_shape=static_shape)
        result = _attempt(name, target, request)
        result.calibration, result.latency_skipped = source, skipped
        results.append(result)
    return results


def _float_ms(path: Path, feeds: Feeds | None) -> float | None:
    """One warm onnxruntime run of the float model in ms (dynamic dims as 1 without feeds); None if it cannot run."""
    import onnxruntime as ort

    from quantize.evaluate import quiet_options

    try:
        session = ort.InferenceSession(str(path), quiet_options(), providers=["CPUExecutionProvider"])
        inputs = feeds(0) if feeds else {
            i.name: np.zeros([d if isinstance(d, int) and d > 0 else 1 for d in i.shape], _NUMPY[i.type])
            for i in session.get_inputs()}
        session.run(None, inputs)
        started = time.perf_counter()
        session.run(None, inputs)
        return (time.perf_counter() - started) * 1000
    except Exception:  # not runnable with these inputs: let the pipeline say why
        return None


_NUMPY = {"tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(int64)": np.int64,
          "tensor(int32)": np.int32, "tensor(uint8)": np.uint8, "tensor(int8)": np.int8, "tensor(bool)": np.bool_,
          "tensor(float16)": np.float16}


def warm_up() -> None:
    """Import what the first run would otherwise pay for (OpenVINO, onnxruntime.quantization), so its time is its own."""
    import onnxruntime.quantization  # noqa: F401

    with contextlib.suppress(ImportError):  # without it latency has no OpenVINO figure; the pipeline notes it
        import openvino  # noqa: F401


def _synthetic(path: Path, static_shape: tuple[str, ...]) -> Feeds | None:
    """Random inputs of the model's signature (quantize's own generator), or None when a dim is unknown."""
    import onnx

    from edgecore.errors import UserError
    from quantize.samples import SampleSet, input_specs

    specs = input_specs(onnx.load(str(path), load_external_data=False))
    fixed = dict(arg.split("=", 1) for arg in static_shape)
    for spec in specs:
        if spec.name in fixed:
            spec.shape[:] = [int(d) for d in fixed[spec.name].split("x")]
    try:
        SampleSet.synthetic_set(specs, 1)
    except UserError:
        return None
    return lambda seed: next(iter(SampleSet.synthetic_set(specs, 1, seed=seed)))


def _calibration(feeds: Feeds | None, folder: Path, count: int) -> Path | None:
    if feeds is None:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    for seed in range(count):
        arrays: dict[str, Any] = feeds(seed)  # Any: numpy's stub reads ** as its allow_pickle keyword
        np.savez(folder / f"{seed:03d}.npz", **arrays)
    return folder


def _attempt(name: str, target: str, request: QuantizeRequest) -> Quantized:
    started = time.perf_counter()
    with capture_runtime_log() as log:
        try:
            outcome = attempt_quantize(request)
            result = Quantized(name, target, "written" if outcome.written else "exit 5",
                               "" if outcome.failure is None else _reason(outcome.failure), outcome.report.data)
            if outcome.written:
                _recheck(result, request, outcome.report)
        except EdgeError as exc:  # bad input for this target (exit 2) or a bug (exit 1): a row that says so
            result = Quantized(name, target, "refused" if exc.exit_code == 2 else f"exit {exc.exit_code}", one_line(exc))
        except Exception as exc:  # a crash is a finding for the table, not the end of the benchmark
            result = Quantized(name, target, "error", f"{type(exc).__name__}: {one_line(exc)}")
    result.reason = result.reason.replace(str(request.model), request.model.name)  # the row names the model
    result.wall_s = time.perf_counter() - started
    result.log_lines = len(log.lines())
    return result


def _recheck(result: Quantized, request: QuantizeRequest, report: Any) -> None:
    """Recompute the written result's figures on its evaluation samples (a finding, never the run's end)."""
    if request.eval_dir is None:
        result.check_note = "synthetic samples only: not recomputed"
        return
    samples = [dict(np.load(p, allow_pickle=False)) for p in sorted(request.eval_dir.glob("*.npz"))]
    try:
        result.checks = recompute(report.data, request.model, report.ir if report.ir is not None else report.model,
                                  samples)
    except Exception as exc:  # a figure for a table: say why, keep going
        result.check_note = f"not recomputed: {type(exc).__name__}: {one_line(exc)[:120]}"


def _reason(failure: Exception) -> str:
    return one_line(failure).split("; nothing written to")[0]  # the path is the benchmark's temp file


def _variant(data: dict[str, Any], name: str) -> dict[str, Any]:
    return next(v for v in data["variants"] if v["name"] == name)


def chosen_format(data: dict[str, Any]) -> str:
    """The chosen variant and its format, e.g. ``int8: QDQ u8 act / s8 per-channel weights, 2 nodes float``."""
    variant = _variant(data, data["chosen"])
    recipe = variant["recipe"]
    if recipe["precision"] == "int8" and recipe["container"] == "onnx":
        act, weight = (_type(recipe["activation_type"]), _type(recipe["weight_type"]))
        text = (f"QDQ {act}{' sym' if recipe['symmetric_activations'] else ''} act / {weight} "
                f"{'per-channel' if recipe['per_channel'] else 'per-tensor'} weights"
                f"{'' if recipe['op_types'] == 'all' else ', ' + '/'.join(recipe['op_types']) + ' only'}")
    else:
        text = variant["format"]
    kept = len(variant["kept_float"])
    return f"{data['chosen']}: {text}" + (f", {kept} nodes float" if kept and recipe["precision"] != "fp32" else "")


def _type(quant_type: str) -> str:
    return {"QUInt8": "u8", "QInt8": "s8", "QUInt16": "u16", "QInt16": "s16"}.get(quant_type, quant_type)


def accuracy(data: dict[str, Any]) -> str:
    """Every output of the chosen variant against the user's model: metric, figure, budget verdict."""
    parts = []
    for score in _variant(data, data["chosen"])["accuracy"]["outputs"]:
        mark = "ok" if score["ok"] else "OVER"
        figure = (f"{score['value']:.1f} dB" if score["unit"] == "dB" else
                  f"{score['value']:.2f} (drop {score['drop']:.2f})")
        parts.append(f"{score['output']}: {score['metric']} {figure} {mark}")
    return "; ".join(parts)


def recomputed(result: Quantized) -> str:
    """The largest gap between a reported figure and the one recomputed, or why there is none."""
    if not result.checks:
        return result.check_note or "-"
    worst = max(result.checks, key=lambda c: c.gap / (2.0 if c.unit == "dB" else 1.0))
    unit = " dB" if worst.unit == "dB" else ""
    return (f"{'agrees' if result.agrees else 'DIFFERS'}: {worst.output} {worst.reported:.2f} vs "
            f"{worst.computed:.2f}{unit}")


def latency(data: dict[str, Any], skipped: str = "") -> str:
    """Each non-float variant's ms over the float model's on this host, with the runtime the target runs; * chosen."""
    if skipped:
        return f"not measured ({skipped})"
    float_ = _variant(data, "float")["latency"]
    key = next((k for k in ("ort_ms", "openvino_ms") if float_.get(k)), None)
    if key is None:
        return "not measured"
    base = float_[key]
    parts = []
    for variant in data["variants"]:
        ms = variant["latency"].get(key)
        if variant["name"] == "float" or ms is None:
            continue
        parts.append(f"{variant['name']}{'*' if variant['name'] == data['chosen'] else ''} {ms / base:.2f}")
    runtime = "OpenVINO" if key == "openvino_ms" else "ORT"
    return (", ".join(parts) + f" ({runtime}, float {base:.3f} ms)") if parts else "float only"


def describe(result: Quantized) -> list[str]:
    """The table row."""
    outcome = result.outcome if not result.reason else f"{result.outcome}: {result.reason[:160]}"
    if not result.data:
        return [result.model, result.target, outcome, "-", "-", "-", "-", f"{result.wall_s:.1f}"]
    return [result.model, result.target, outcome, chosen_format(result.data), accuracy(result.data),
            recomputed(result), latency(result.data, result.latency_skipped), f"{result.wall_s:.1f}"]


HEADER = ["model", "target", "outcome", "chosen: format", "accuracy per output vs your model (budget)",
          "recomputed here (largest gap)", "latency quantized / float, this host, the target's runtime (* chosen)", "s"]


def markdown(results: list[Quantized], settings: QuantSettings) -> str:
    """The section's text: what was run and measured, the counts, the table."""
    counts = Counter(r.outcome for r in results)
    models = len({r.model for r in results})
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(cell.replace("|", "/") for cell in describe(r)) + " |" for r in results]
    logged = sum(r.log_lines for r in results)
    other = len(results) - counts["written"] - counts["exit 5"] - counts["refused"] - counts["skipped"]
    tally = (f"{counts['written']} written, {counts['exit 5']} exit 5, {counts['refused']} refused, "
             f"{counts['skipped']} skipped, {other} other")
    skip = ("" if settings.quantize_max_ms is None else f" Models whose float inference takes over "
            f"{settings.quantize_max_ms:g} ms here are skipped (`--quantize-max-ms`): calibrating them needs more "
            f"memory and time than a benchmark run on a small, shared host should take.")
    cap = ("" if settings.measure_max_ms is None else
           f", except for models whose float inference takes over {settings.measure_max_ms:g} ms here")
    measured = (f"latency measured by the pipeline (interleaved, with the runtime the target runs: OpenVINO for "
                f"OpenVINO targets, onnxruntime for the others){cap}" if settings.measure else
                "latency not measured (--no-measure: `auto` then keeps the float model on CPU targets, which "
                "choose by speed)")
    plural = "s" if models != 1 else ""
    checked = [r for r in results if r.checks]
    agree = sum(bool(r.agrees) for r in checked)
    return (f"{models} model{plural} x {len(settings.targets)} targets ({', '.join(settings.targets)}), `edgectl "
            f"quantize --mode auto --max-drop {settings.max_drop:g} --min-db {settings.min_db:g}` through "
            f"`quantize.pipeline.attempt_quantize`; calibration on {settings.calib} samples per model (the corpus's "
            f"own inputs, or the shared model's golden inputs where the benchmark has them, else synthetic), which are "
            f"also the evaluation samples: accuracy is against the user's model on those samples (optimistic: no "
            f"held-out data), each output with the metric the report names. **Every written result's figures recomputed "
            f"here** (`scripts/quantize_check.py`: both models run again, the metric in numpy; agreement within 0.5 "
            f"points or 1 dB): **{agree} of {len(checked)} agree**. {measured}. The latency ratio is the host CPU "
            f"running the target's format with the target's runtime (onnxruntime, or OpenVINO's CPU plugin), **not the "
            f"target**: an fp16 or NNAPI-format model is expected to be slower here. s: wall time of the run.{skip} "
            f"**{tally}** of {len(results)}; "
            f"onnxruntime wrote {logged} log lines, captured.\n\n" + "\n".join(lines))
