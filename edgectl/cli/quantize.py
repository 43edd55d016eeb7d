"""`edgectl quantize`: target-aware quantization within an accuracy budget."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from edgecore.errors import UserError
from edgectl.cli.app import app

__all__ = ["quantize"]


@app.command()
def quantize(
    model: Path = typer.Argument(..., help="FP32 ONNX model to quantize."),
    target: str = typer.Option(..., "--target", "-t", help="Target profile name, e.g. jetson-orin, nnapi, cpu-x86."),
    output: Path = typer.Option(..., "--output", "-o", help="Where to write the quantized model (written atomically)."),
    mode: str = typer.Option("auto", "--mode", "-m",
                             help="int8 (static QDQ), dynamic, fp16, or auto (the target's precision policy; "
                                  "on CPU targets the fastest variant within the budget)."),
    calib: Path | None = typer.Option(None, "--calib",
                                         help="Folder of calibration samples: .npy/.npz (keys = input names) "
                                              "or JPEG/PNG images (see --preprocess)."),
    calib_synthetic: int = typer.Option(0, "--calib-synthetic", min=0,
                                        help="Calibrate on N random samples instead (accuracy then unknown)."),
    preprocess: Path | None = typer.Option(None, "--preprocess",
                                              help="YAML with image preprocessing per input (resize, "
                                                   "channel_order, mean, std, layout)."),
    method: str = typer.Option("minmax", "--method", help="Calibration method: minmax, entropy or percentile."),
    eval_dir: Path | None = typer.Option(None, "--eval",
                                            help="Held-out samples (same formats as --calib), with optional "
                                                 "labels.txt/labels.npy; without labels the float model's "
                                                 "outputs are the reference."),
    max_drop: float = typer.Option(1.0, "--max-drop", min=0.0,
                                   help="Accuracy budget of agreement metrics (top-1/top-5, per-pixel class, "
                                        "confident detections, exact): points (0-100) lost against your model."),
    min_db: float = typer.Option(30.0, "--min-db",
                                 help="Accuracy budget of signal metrics (SQNR for regressions/embeddings, PSNR for "
                                      "images): the dB every such output must reach against your model."),
    fp16_io: bool = typer.Option(False, "--fp16-io", help="With fp16, convert graph inputs/outputs to fp16 too."),
    report: Path | None = typer.Option(None, "--report", help="Also write an HTML report with a per-node error plot."),
    json_out: bool = typer.Option(False, "--json", help="Print the JSON report instead of the table."),
    no_measure: bool = typer.Option(False, "--no-measure", help="Skip the latency measurement."),
    static_shape: list[str] = typer.Option([], "--static-shape",
                                           help="NAME=1x3x224x224 for an input with dynamic dims (repeatable); "
                                                "without it, shapes come from the first --calib sample."),
    metric: list[str] = typer.Option([], "--metric",
                                     help="Accuracy metric: auto (chosen per output, the report says why), top1, "
                                          "top5, pixel-top1, detection, sqnr, psnr or exact; OUTPUT=METRIC for one "
                                          "output (repeatable)."),
) -> None:
    """Quantize MODEL in the format TARGET needs, within the budget; writes OUT and OUT.quant.json.

    Every figure compares the written file with MODEL as given, on the same inputs. For MYRIAD and NPU
    targets the result is an OpenVINO IR (OUT.xml + OUT.bin) with FP16-compressed weights.
    """
    from quantize import Mode, QuantizeRequest, run_quantize  # heavy imports only when the command runs
    from quantize.runtime_log import RuntimeLog, capture_runtime_log

    try:
        chosen_mode = Mode(mode)
    except ValueError:
        raise UserError(f"--mode {mode!r}: use one of {', '.join(m.value for m in Mode)}") from None
    if calib is not None and calib_synthetic:
        raise UserError("give either --calib DIR or --calib-synthetic N, not both")
    request = QuantizeRequest(
        model=model, target=target, output=output, mode=chosen_mode, calib_dir=calib,
        calib_synthetic=calib_synthetic, preprocess=preprocess, method=method, eval_dir=eval_dir,
        max_drop=max_drop, min_db=min_db, fp16_io=fp16_io, measure=not no_measure, per_node_errors=report is not None,
        static_shape=tuple(static_shape), metric=tuple(metric),
    )
    console = Console(stderr=True)
    log_path = output.with_suffix(".quant.log")
    log = RuntimeLog()
    try:
        with capture_runtime_log(log):
            result = run_quantize(request, console)
    finally:  # the log explains a failure too
        if log.lines():
            log.write(log_path)
            console.print(log.summary(log_path))
    if log.lines():
        result = result.with_note(log.summary(log_path))
    files = result.write(output, output.with_suffix(".quant.json"), report)
    if json_out:
        typer.echo(result.to_json())
        return
    Console().print(result.table())
    for note in result.data["notes"]:
        console.print(f"note: {note}")
    console.print(f"wrote {' and '.join(map(str, files))} and {output.with_suffix('.quant.json')}"
                  + (f" and {report}" if report else ""))
