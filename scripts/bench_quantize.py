"""Benchmark `edgectl quantize`: speed and size per variant, OpenVINO INT8, and every figure recomputed.

Three parts, each in one run on this host, each written to its own section of docs/benchmarks.md:

1. ``quantize`` (cpu-x86, ``auto``): INT8 vs FP32 latency (onnxruntime, what the target runs), size, the worst
   output against the user's model, what ``auto`` picks and its wall time, on a MobileNetV2-style net
   and a YOLO-style detector of about 400 nodes generated here (``auto`` must end in <= 60 s on 2 cores),
   an MLP trained here on scikit-learn's digits, and mnist-8 and ultraface from ../shared/models. Each
   model runs in its own process, so peak memory is its own.
2. ``quantize: OpenVINO INT8`` (cpu-x86-openvino): float, the QDQ INT8 model the pipeline writes and
   NNCF's INT8 IR, compiled as the agent serves them (f32 inference precision) and timed interleaved;
   goal INT8/FP32 <= 0.5 on MobileNetV2; prints what OpenVINO really runs per compute layer.
3. ``quantize per target (generated corpus)`` and ``(shared models)``: every corpus and shared model x
   target through ``scripts/corpus_quantize.py`` (as ``./scripts/bench corpus --no-probe`` runs it):
   outcome (exit code), time, and each written figure recomputed independently
   (``scripts/quantize_check.py``); goal: within 0.5 points or 1 dB everywhere, and no internal error.

Rerun: ./scripts/bench quantize [--parts 1,2,3] [--no-docs]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from benchdoc import machine, write_section  # noqa: E402
from corpus_quantize import DEFAULT_TARGETS, Quantized, QuantSettings, quantize_model, warm_up  # noqa: E402
from corpus_quantize import describe as describe_quantized  # noqa: E402
from quantize_models import (  # noqa: E402
    MODELS,
    detector_400,
    digits_mlp,
    mnist_digits,
    mobilenet_v2,
    ultraface,
    write_samples,
)

T = TypeVar("T")
Report = dict[str, Any]  # quantize_one's result: the report's data, wall time, peak RSS
Row = tuple[str, Report]
DETECTOR = "detector ~400 nodes (generated)"
TARGETS = (*DEFAULT_TARGETS, "cpu-x86-openvino")
COMMAND = "./scripts/bench quantize"


def quantize_one(model: str, calib: str, eval_dir: str, target: str = "cpu-x86", mode: str = "auto") -> Report:
    """Run the pipeline in this (fresh) process; report figures, wall time and peak RSS."""
    from quantize import Mode, QuantizeRequest
    from quantize.pipeline import attempt_quantize

    start, cpu = time.perf_counter(), _cpu_s()
    request = QuantizeRequest(model=Path(model), target=target, output=Path(tempfile.mkdtemp()) / "o.onnx",
                              mode=Mode(mode), calib_dir=Path(calib), eval_dir=Path(eval_dir))
    outcome = attempt_quantize(request)
    return {"data": outcome.report.data, "wall_s": time.perf_counter() - start, "failure": str(outcome.failure or ""),
            "cpu_s": _cpu_s() - cpu, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _cpu_s() -> float:
    """CPU seconds this process has used (every thread): what the run costs whatever else shares the cores."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def calibration_peak(model: str, samples: int) -> float:
    """Peak RSS (MB) of a process that only calibrates and quantizes (int8, no eval, no latency)."""
    from rich.console import Console

    from quantize import Mode, QuantizeRequest, run_quantize

    request = QuantizeRequest(model=Path(model), target="jetson-orin", output=Path("/dev/null"), mode=Mode.INT8,
                              calib_synthetic=samples, measure=False, max_drop=100.0, min_db=-100.0, max_eval=4)
    run_quantize(request, Console(quiet=True))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def openvino_int8(model: str, calib: str, eval_dir: str, rounds: int = 10, runs: int = 20) -> dict[str, Any]:
    """Float, the pipeline's QDQ INT8 and NNCF's INT8 IR on OpenVINO's CPU as the agent serves them, interleaved."""
    from quantize import Mode, QuantizeRequest
    from quantize.nncf_ptq import available, quantize_nncf
    from quantize.openvino_ir import IrModel, compile_cpu, precision_report
    from quantize.pipeline import attempt_quantize
    from quantize.samples import SampleSet, input_specs

    request = QuantizeRequest(model=Path(model), target="cpu-x86-openvino", output=Path(tempfile.mkdtemp()) / "o.onnx",
                              mode=Mode.INT8, calib_dir=Path(calib), eval_dir=Path(eval_dir), measure=False)
    qdq = attempt_quantize(request).report
    assert qdq.model is not None
    work = Path(tempfile.mkdtemp())
    onnx.save(qdq.model, work / "qdq.onnx")
    sources: dict[str, Path | IrModel] = {"float": Path(model), "int8 (QDQ ONNX)": work / "qdq.onnx"}
    started = time.perf_counter()
    if available():
        sources["int8 (NNCF IR)"] = quantize_nncf(onnx.load(model), SampleSet.from_dir(Path(calib),
                                                                                      input_specs(onnx.load(model))))
    nncf_s = time.perf_counter() - started
    feeds = next(iter(SampleSet.from_dir(Path(eval_dir), input_specs(onnx.load(model)))))
    requests = {name: compile_cpu(src).create_infer_request() for name, src in sources.items()}
    for request_ in requests.values():
        for _ in range(5):
            request_.infer(feeds)
    times: dict[str, list[float]] = {name: [] for name in requests}
    for k in range(rounds):
        for name in list(requests) if k % 2 == 0 else list(requests)[::-1]:
            for _ in range(runs):
                begin = time.perf_counter()
                requests[name].infer(feeds)
                times[name].append((time.perf_counter() - begin) * 1000)
    chosen = next(v for v in qdq.data["variants"] if v["name"] == "int8")
    return {"ms": {n: statistics.median(t) for n, t in times.items()},
            "precision": {n: precision_report(s) for n, s in sources.items()},
            "qdq_accuracy": chosen["accuracy"], "nncf_s": nncf_s, "nncf": available()}


def _in_child(fn: Callable[..., T], *args: Any) -> T:
    with ProcessPoolExecutor(1, mp_context=get_context("spawn"), max_tasks_per_child=1) as pool:
        return pool.submit(fn, *args).result()


def _variant(data: Report, name: str) -> Report:
    variant: Report = next(v for v in data["variants"] if v["name"] == name)
    return variant


def _ratio(data: Report, name: str, key: str) -> float:
    a, b = _variant(data, name)["latency"].get(key), _variant(data, "float")["latency"].get(key)
    return a / b if a and b else float("nan")


def _worst(variant: Report) -> str:
    accuracy = variant["accuracy"]
    unit = " dB" if accuracy["unit"] == "dB" else ""
    return (f"{accuracy['worst_output']}: {accuracy['metric']} {accuracy['value']:.2f}{unit} "
            f"({accuracy['budget_share']:.2f}x budget)")


def part_one(work: Path) -> tuple[str, list[tuple[bool, str]]]:
    """cpu-x86 auto on the generated, trained and shared models: the table and its goals."""
    rng = np.random.default_rng(0)
    mnv2 = work / "mobilenetv2.onnx"
    onnx.save(mobilenet_v2(), mnv2)
    mlp, xtr, xte, _ytr, yte = digits_mlp()
    onnx.save(mlp, work / "digits_mlp.onnx")
    det = work / "detector400.onnx"
    onnx.save(detector_400(), det)
    images = rng.random((48, 3, 160, 160), np.float32) * 2 - 1
    cases: list[tuple[str, Path, Path, Path]] = [
        ("MobileNetV2 160x160 (generated)", mnv2, write_samples(work / "mn_calib", images[:32]),
         write_samples(work / "mn_eval", images[32:])),
        ("digits MLP (trained here)", work / "digits_mlp.onnx", write_samples(work / "d_calib", xtr[:300]),
         write_samples(work / "d_eval", xte, yte)),
        (DETECTOR, det, write_samples(work / "det_calib", rng.random((32, 3, 256, 256), np.float32)),
         write_samples(work / "det_eval", rng.random((16, 3, 256, 256), np.float32)))]
    if MODELS.is_dir():
        cases += [("mnist-8 (labels)", *mnist_digits(work)), ("ultraface RFB-320", *ultraface(work))]
    rows = []
    for name, model, calib, ev in cases:
        rows.append((name, _in_child(quantize_one, str(model), str(calib), str(ev))))
        print(f"{name}: {rows[-1][1]['data']['chosen_format']} in {rows[-1][1]['wall_s']:.1f} s", flush=True)
    peaks = {n: _in_child(calibration_peak, str(mnv2), n) for n in (100, 1000)}
    nodes = len(detector_400().graph.node)
    intro = ("Each model quantized in its own process by `edgectl quantize`'s pipeline in `auto` mode for `cpu-x86`: "
             "float, INT8 on all ops and INT8 on Conv/MatMul/Gemm only, timed with onnxruntime (the runtime the target "
             "runs) in one interleaved run (medians); ratios "
             "are variant / FP32 in the same run. Accuracy is against the float model on held-out samples: the digits "
             "test split with labels (top-1 accuracy; the MLP is trained here), sklearn digits upscaled to 28x28 with "
             "labels for mnist-8, augmented crops of the upstream photo for ultraface (confident-face agreement), "
             "random inputs for the random-weight MobileNetV2 (top-1 agreement) and the generated detector (SQNR per "
             f"head). The detector has {nodes} nodes and three heads on 1x3x256x256 (32 calibration, 16 evaluation "
             "samples); its wall time is the goal: `auto` in 60 s or less on 2 cores. The budget column is the worst "
             "output's share of the budget (<= 1 is within it: `--max-drop 1`, `--min-db 30`).\n\n")
    return intro + _table(rows), _goals(rows, peaks, nodes)


def _table(rows: list[Row]) -> str:
    head = ("| model | INT8/FP32 ORT | size INT8/FP32 | INT8 worst output vs your model | auto picks "
            "| auto/FP32 ORT | int8-compute/FP32 ORT | wall s | CPU s | peak MB |")
    lines = [head, "|" + "---|" * 10]
    for name, r in rows:
        d = r["data"]
        i8 = _variant(d, "int8")
        lines.append(f"| {name} | {_ratio(d, 'int8', 'ort_ms'):.2f} | "
                     f"{i8['size_ratio']:.2f} | {_worst(i8)} | {d['chosen']} | {_ratio(d, d['chosen'], 'ort_ms'):.2f} | "
                     f"{_ratio(d, 'int8-compute', 'ort_ms'):.2f} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | "
                     f"{r['peak_mb']:.0f} |")
    return "\n".join(lines)


def _goals(rows: list[Row], peaks: dict[int, float], nodes: int) -> list[tuple[bool, str]]:
    out: list[tuple[bool, str]] = []
    for name, res in rows:
        d = res["data"]
        within = [v for v in d["variants"] if v["accuracy"]["ok"]]
        fastest = min(v["latency"]["ort_ms"] for v in within)
        chosen = _variant(d, d["chosen"])["latency"]["ort_ms"]
        out.append((chosen <= _variant(d, "float")["latency"]["ort_ms"] and chosen <= fastest * 1.05,
                    f"{name}: auto ({d['chosen']}) never slower than its input and within 5% of the fastest within budget"))
        if name == DETECTOR:
            out.append((res["wall_s"] <= 60.0, f"{name} ({nodes} nodes): auto (cpu-x86, 3 variants, latency measured) took "
                        f"{res['wall_s']:.1f} s <= 60 s ({os.cpu_count()} cores, load average {_load()}); it used "
                        f"{res['cpu_s']:.1f} CPU seconds (every thread), about the most its wall time is on idle cores"))
    growth = peaks[1000] / peaks[100]
    out.append((growth <= 1.10, f"calibration peak memory 100 -> 1000 samples: {peaks[100]:.0f} -> {peaks[1000]:.0f} MB "
                                f"(x{growth:.2f} <= 1.10)"))
    return out


def part_two(work: Path) -> tuple[str, list[tuple[bool, str]]]:
    """OpenVINO INT8 vs FP32 on MobileNetV2 at the agent's precision, interleaved, and what OpenVINO runs."""
    rng = np.random.default_rng(1)
    model = work / "mobilenetv2-ov.onnx"
    onnx.save(mobilenet_v2(), model)
    calib = write_samples(work / "ov_calib", rng.random((32, 3, 160, 160), np.float32) * 2 - 1)
    ev = write_samples(work / "ov_eval", rng.random((16, 3, 160, 160), np.float32) * 2 - 1)
    result = _in_child(openvino_int8, str(model), str(calib), str(ev))
    ms = result["ms"]
    lines = ["| variant | OpenVINO CPU ms (median) | / float | what OpenVINO runs |", "|---|---|---|---|"]
    lines += [f"| {name} | {value:.2f} | {value / ms['float']:.2f} | {result['precision'][name]} |" for name, value in ms.items()]
    best = min(v for n, v in ms.items() if n != "float") / ms["float"]
    accuracy = result["qdq_accuracy"]
    intro = ("MobileNetV2 160x160 (generated, random weights) for `cpu-x86-openvino`: the float model, the QDQ INT8 "
             "model `edgectl quantize --mode int8` writes, and NNCF's INT8 IR (performance preset, 32 calibration "
             "samples), each compiled for OpenVINO's CPU plugin exactly as the agent serves (latency hint, "
             "`INFERENCE_PRECISION_HINT` f32) and timed in 10 rounds of 20 inferences, alternating order. \"What "
             "OpenVINO runs\" is read back from the compiled model: its inference precision and the runtime precision "
             "of every convolution/matmul layer.\n\n")
    text = (intro + "\n".join(lines) + f"\n\nQDQ INT8 against the float model: {accuracy['metric']} {accuracy['value']:.2f} "
            f"(16 random inputs; random weights). NNCF: "
            + (f"{result['nncf_s']:.1f} s to quantize on 32 samples." if result["nncf"] else "not installed."))
    return text, [(best <= 0.5, f"MobileNetV2 OpenVINO INT8/FP32 at f32 inference precision {best:.2f} <= 0.5")]


def part_three(work: Path, targets: tuple[str, ...], which: str) -> tuple[str, list[tuple[bool, str]]]:
    """Every corpus (or shared) model x target: outcome, time and each written figure recomputed here."""
    from bench_corpus import models
    from corpus_quantize import markdown

    settings = QuantSettings(targets, calib=8, measure_max_ms=100.0, quantize_max_ms=150.0)
    warm_up()
    results: list[Quantized] = []
    for subject in models(which, [], work):
        results += quantize_model(subject.name, subject.path, subject.feeds, subject.static_shape, work, settings)
        for r in results[-len(targets):]:
            print(" | ".join(describe_quantized(r)), flush=True)
    checked = [r for r in results if r.checks]
    worst = max((c for r in checked for c in r.checks), key=lambda c: c.gap / (2.0 if c.unit == "dB" else 1.0),
                default=None)
    crashed = [r for r in results if r.outcome not in ("written", "exit 5", "refused", "skipped")]
    goals = [(all(r.agrees for r in checked),
              f"every written figure recomputed within 0.5 points / 1 dB: {sum(bool(r.agrees) for r in checked)} of "
              f"{len(checked)} results" + (f" (largest gap {worst.gap:.3f} {worst.unit}, {worst.output})" if worst else "")),
             (not crashed, f"no internal error or crash: {len(crashed)} of {len(results)} runs"
                           + (f" ({crashed[0].model} {crashed[0].target}: {crashed[0].outcome})" if crashed else ""))]
    return markdown(results, settings), goals


def _load() -> str:
    return " / ".join(f"{x:.1f}" for x in os.getloadavg())


# part -> the docs/benchmarks.md section it writes (part 3's are those `./scripts/bench corpus --no-probe` writes too)
SECTIONS = {"1": "quantize", "2": "quantize: OpenVINO INT8", "3": "quantize per target (generated corpus)",
            "3s": "quantize per target (shared models)"}


def _run_part(part: str, work: Path, targets: tuple[str, ...]) -> tuple[str, list[tuple[bool, str]]]:
    if part == "1":
        return part_one(work)
    if part == "2":
        return part_two(work)
    return part_three(work, targets, "corpus" if part == "3" else "shared")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="1,2,3", help="which parts to run (default 1,2,3)")
    parser.add_argument("--targets", default=",".join(TARGETS), help=f"part 3's targets (default {','.join(TARGETS)})")
    parser.add_argument("--no-docs", action="store_true", help="do not write the figures into docs/benchmarks.md")
    args = parser.parse_args()
    parts = {p.strip() for p in args.parts.split(",")}
    flags = Path("/proc/cpuinfo").read_text().split("flags")[1].split("\n")[0].split()
    vnni = [f for f in flags if "vnni" in f]
    header = (f"Machine: {machine()}; {'VNNI: ' + ', '.join(vnni) if vnni else 'no VNNI (AVX2 8-bit kernels only)'}; "
              f"load average (1/5/15 min) at the start: {_load()}.")
    print(header, flush=True)
    targets = tuple(t for t in args.targets.split(",") if t)
    with tempfile.TemporaryDirectory(prefix="bench-quantize-") as tmp:
        for part in ("1", "2", "3", "3s"):
            if part.rstrip("s") not in parts:
                continue
            started = time.perf_counter()
            body, goals = _run_part(part, Path(tmp), targets)
            verdicts = "\n".join(f"- **{'PASS' if ok else 'FAIL'}** {text}" for ok, text in goals)
            took = f"This part took {time.perf_counter() - started:.0f} s; load average at its end {_load()}."
            text = f"{header}\n\n{body}\n\n{verdicts}\n\n{took}"
            print(f"\n## {SECTIONS[part]}\n\n{text}", flush=True)
            if not args.no_docs:
                write_section(SECTIONS[part], COMMAND + (f" --parts {part[0]}" if parts != {"1", "2", "3"} else ""), text)
    print(f"\nrerun: {COMMAND} --parts {','.join(sorted(parts))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
