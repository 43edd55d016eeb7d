"""Median latency of model variants on this host, measured in one interleaved run with the runtime the target runs.

An onnxruntime target is timed with onnxruntime's CPU provider (``ort_ms``), an OpenVINO target with
OpenVINO's CPU plugin (``openvino_ms``); the other runtime's figure is left empty (timing it cost a
large model half a minute of compilation for a figure no decision reads).

OpenVINO compiles each variant as the agent serves it (``quantize.openvino_ir.compile_cpu``: the
latency hint and f32 inference precision), so a CPU with bf16 does not time a cheaper precision
than the device will run. An OpenVINO IR variant has no onnxruntime figure.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from quantize.openvino_ir import IrModel, compile_cpu
from quantize.samples import cast_to_inputs

__all__ = ["Latency", "measure_latency"]

Latency = dict[str, dict[str, float | None]]  # variant -> {"ort_ms": .., "openvino_ms": ..}
Runner = Callable[[], object]


def measure_latency(variants: dict[str, onnx.ModelProto | IrModel], feeds: dict[str, np.ndarray], key: str,
                    rounds: int = 5, runs_per_round: int = 6) -> tuple[Latency, list[str]]:
    """Median milliseconds per inference for each variant and runtime, plus notes on what could not run.

    Rounds alternate between variants so drift on a shared machine hits them all alike.
    """
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="edgectl-lat-") as tmp:
        runners: dict[tuple[str, str], Runner] = {}
        make: Callable[..., Runner] = _openvino_runner if key == "openvino_ms" else _ort_runner
        for name, model in variants.items():
            if isinstance(model, IrModel):
                source: Path | IrModel = model
                typed = feeds
            else:
                source = Path(tmp) / f"{name}.onnx"
                onnx.save(model, source)
                typed = cast_to_inputs(model, feeds)
            try:
                if isinstance(source, IrModel) and key != "openvino_ms":
                    raise ValueError("an OpenVINO IR runs on OpenVINO only")
                runners[(name, key)] = _warmed(make(source, typed))
            except Exception as exc:  # latency is optional for the result; say why one is missing
                runtime = "OpenVINO" if key == "openvino_ms" else "onnxruntime"
                notes.append(f"{runtime} latency of {name} not measured: {_reason(exc)}")
        times = _interleaved(runners, rounds, runs_per_round)
    result: Latency = {name: {"ort_ms": None, "openvino_ms": None} for name in variants}
    for (name, runtime), samples in times.items():
        result[name][runtime] = round(statistics.median(samples) * 1000.0, 4)
    return result, notes


def _reason(exc: Exception) -> str:
    # OpenVINO's first line is a source location; the reason is in the following lines.
    lines = [line.strip() for line in str(exc).splitlines() if line.strip() and "src/" not in line]
    return (" ".join(lines[:2]) or type(exc).__name__)[:200]


def _warmed(run: Runner) -> Runner:
    """`run` after three warm-up calls (first runs allocate and tune); raises what the runtime raises."""
    for _ in range(3):
        run()
    return run


def _interleaved(runners: dict[tuple[str, str], Runner], rounds: int, runs: int) -> dict[tuple[str, str], list[float]]:
    times: dict[tuple[str, str], list[float]] = {key: [] for key in runners}
    for _ in range(rounds):
        for key, run in runners.items():
            for _ in range(runs):
                start = time.perf_counter()
                run()
                times[key].append(time.perf_counter() - start)
    return times


def _ort_runner(path: Path, feeds: dict[str, np.ndarray]) -> Runner:
    options = ort.SessionOptions()
    options.log_severity_level = 2  # warnings go to the runtime log (quantize.runtime_log)
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return lambda: session.run(None, feeds)


def _openvino_runner(source: Path | IrModel, feeds: dict[str, np.ndarray]) -> Runner:
    compiled = compile_cpu(source)
    request = compiled.create_infer_request()
    by_name = {name: port for port in compiled.inputs for name in port.get_names()}
    inputs = {by_name[name]: value for name, value in feeds.items() if name in by_name}
    return lambda: request.infer(inputs)
