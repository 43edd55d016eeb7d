"""Quantization takes the models users really bring: the corpus over every target, shapes, metrics, CoreML."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from rich.console import Console

from edgecore.errors import ModelError, UserError
from quantize import Mode, QuantizeRequest, run_quantize
from quantize.openvino_ir import IrModel
from quantize.opset import default_opset
from quantize.pipeline import attempt_quantize
from quantize.rules import is_quantized
from tests.corpus import CORPUS, build, write_corpus
from tests.quantize.models import save, tiny_cnn

# One target per written format: the mode each is run in, and what it writes.
FORMATS = {
    "cpu-x86": (Mode.INT8, "INT8 QDQ, u8 activations / s8 per-channel weights"),
    "jetson-orin": (Mode.AUTO, "INT8 QDQ, s8 symmetric everywhere (TensorRT)"),
    "nnapi": (Mode.AUTO, "INT8 QDQ, u8 activations / s8 per-channel weights (NNAPI)"),
    "qnn-htp": (Mode.AUTO, "INT8 QDQ, u8 activations / u8 per-tensor weights (QNN)"),
    "coreml-mlprogram": (Mode.AUTO, "fp16 ONNX"),
    "myriad": (Mode.AUTO, "OpenVINO IR, FP16-compressed weights (or the float model)"),
    "cpu-x86-openvino": (Mode.INT8, "INT8 QDQ that OpenVINO runs"),
}
REFUSED = {"unloadable": "cannot load the model as given", "already_quantized": "already quantized"}


def _request(model: Path, target: str, tmp: Path, **kw: Any) -> QuantizeRequest:
    return QuantizeRequest(model=model, target=target, output=tmp / "out.onnx", calib_synthetic=4, measure=False,
                           max_drop=100.0, min_db=-100.0, **kw)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edgectl.cli.main", "quantize", *args],
                          capture_output=True, text=True, timeout=180)


def _openvino_compiles(model: Path | IrModel) -> None:
    import openvino as ov

    core = ov.Core()
    read = (core.read_model(str(model)) if isinstance(model, Path) else
            core.read_model(model=model.xml.decode(), weights=ov.Tensor(np.frombuffer(model.weights, np.uint8))))
    core.compile_model(read, "CPU")


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_every_file_written_for_every_format_is_valid(tmp_path: Path, name: str) -> None:
    """onnx's full check, onnxruntime and (OpenVINO targets) OpenVINO accept every file written; nothing else fails."""
    entry = CORPUS[name]
    path = save(build(name), tmp_path / f"{name}.onnx") if name != "unloadable" else write_corpus(tmp_path, [name])[name]
    calib = tmp_path / "calib"  # the corpus's own feeds: a random loop count would blow the Loop up
    calib.mkdir()
    for seed in range(2):
        # allow_pickle is numpy's default, named so that mypy does not match **feeds against it
        np.savez(calib / f"{seed}.npz", allow_pickle=True, **entry.feeds(seed))
    for target, (mode, _) in FORMATS.items():
        request = QuantizeRequest(model=path, target=target, output=tmp_path / "out.onnx", mode=mode, calib_dir=calib,
                                  measure=False, max_drop=100.0, min_db=-100.0,
                                  static_shape=tuple(entry.static_shape_args()))
        try:
            outcome = attempt_quantize(request)
        except ModelError as exc:  # only the traits that are refused, with their reason
            assert name in REFUSED and REFUSED[name] in str(exc), (target, exc)
            continue
        if not outcome.written:  # an honest exit 5: worse on the target, or no valid file of that format
            assert outcome.failure is not None and "nothing written" in str(outcome.failure), target
            continue
        report = outcome.report
        assert report.model is not None
        files = report.write(tmp_path / f"{target}.onnx", tmp_path / f"{target}.quant.json", None)
        if report.ir is not None:
            _openvino_compiles(report.ir)
            assert files[1].suffix == ".xml" and files[0].suffix == ".bin"
            continue
        onnx.checker.check_model(str(files[0]), full_check=True)
        session = ort.InferenceSession(str(files[0]), providers=["CPUExecutionProvider"])
        feeds = {i.name: v for i, v in zip(session.get_inputs(), entry.feeds().values(), strict=True)}
        outputs = session.run(None, feeds)
        assert all(np.all(np.isfinite(o.astype(np.float64))) for o in outputs if np.issubdtype(o.dtype, np.floating))
        if target in ("myriad", "cpu-x86-openvino"):
            _openvino_compiles(files[0])
        chosen = next(v for v in report.data["variants"] if v["name"] == report.data["chosen"])
        assert chosen["target_check"]["ok"] and not chosen["problems"], (target, chosen["problems"])


def test_constant_node_weights_are_quantized(tmp_path: Path) -> None:
    path = save(build("constant_weights"), tmp_path / "m.onnx")
    report = run_quantize(_request(path, "cpu-x86", tmp_path, mode=Mode.INT8), Console(quiet=True))
    assert report.model is not None and "QuantizeLinear" in is_quantized(report.model)
    assert any("Constant nodes moved to initializers" in n for n in report.data["notes"])


def test_dynamic_input_needs_a_shape_and_takes_it_from_flag_or_samples(tmp_path: Path) -> None:
    path = save(build("dynamic_input"), tmp_path / "m.onnx")
    with pytest.raises(UserError, match=r"input 'x' has dynamic dims \[\?,3,\?,\?\] float32: give --static-shape x=1x3xHxW"):
        run_quantize(_request(path, "cpu-x86", tmp_path, mode=Mode.INT8), Console(quiet=True))
    report = run_quantize(_request(path, "nnapi", tmp_path, static_shape=("x=1x3x24x24",)), Console(quiet=True))
    assert report.model is not None
    assert [d.dim_value for d in report.model.graph.input[0].type.tensor_type.shape.dim] == [1, 3, 24, 24]
    calib = tmp_path / "calib"
    calib.mkdir()
    for i in range(3):
        np.save(calib / f"{i}.npy", np.random.default_rng(i).random((1, 3, 20, 28), dtype=np.float32))
    request = QuantizeRequest(model=path, target="jetson-orin", output=tmp_path / "o.onnx", calib_dir=calib,
                              measure=False, max_drop=100.0)
    report = run_quantize(request, Console(quiet=True))
    assert any("x=1x3x20x28 (from the first sample" in n for n in report.data["notes"])


def test_symbolic_batch_alone_is_set_to_one(tmp_path: Path) -> None:
    path = save(build("symbolic_batch"), tmp_path / "m.onnx")
    report = run_quantize(_request(path, "qnn-htp", tmp_path), Console(quiet=True))
    assert any("dynamic batch set to 1" in n for n in report.data["notes"])


@pytest.mark.parametrize("flag,message", [
    ("x=1x3xAx4", r"--static-shape 'x=1x3xAx4': use NAME=1x3x224x224 \(positive integers\)"),
    ("x=1x3x0x4", r"--static-shape 'x=1x3x0x4': use NAME=1x3x224x224"),
    ("image=1x3x8x8", r"--static-shape image=\.\.\.: the model has no input 'image' \(inputs: x\)"),
    ("x=1x3x8", r"--static-shape x=1x3x8: input 'x' has rank 4"),
    ("x=1x4x8x8", r"input 'x' is \[\?,3,\?,\?\] float32, dim 1 is fixed at 3"),
], ids=["not-a-number", "zero", "unknown-input", "rank", "fixed-dim"])
def test_bad_static_shape_is_one_line_exit_2(tmp_path: Path, flag: str, message: str) -> None:
    path = save(build("dynamic_input"), tmp_path / "m.onnx")
    proc = _cli(str(path), "--target", "cpu-x86", "-o", str(tmp_path / "o.onnx"), "--calib-synthetic", "2",
                "--static-shape", flag, "--no-measure")
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert re.search(message, proc.stderr), proc.stderr


@pytest.mark.parametrize("flag,message", [
    ("cosine", "--metric 'cosine': use one of auto, top1, top5, pixel-top1, detection, sqnr, psnr, exact"),
    ("labels=sqnr", "--metric labels=...: the model has no output 'labels' (outputs: boxes, scores)"),
    ("boxes=pixel-top1", "--metric boxes=pixel-top1: output 'boxes' has shape [1, 128, 4], not a [N,C,H,W]"),
], ids=["unknown-metric", "unknown-output", "wrong-shape"])
def test_bad_metric_is_one_line_exit_2(tmp_path: Path, flag: str, message: str) -> None:
    path = save(build("detector"), tmp_path / "m.onnx")
    proc = _cli(str(path), "--target", "jetson-orin", "-o", str(tmp_path / "o.onnx"), "--mode", "fp16",
                "--metric", flag, "--no-measure")
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and message in proc.stderr, proc.stderr


def test_metric_follows_each_output(tmp_path: Path) -> None:
    kinds = {}
    for name, target in (("detector", "jetson-orin"), ("nhwc", "myriad"), ("symbolic_batch", "myriad")):
        path = save(build(name), tmp_path / f"{name}.onnx")
        report = run_quantize(_request(path, target, tmp_path, mode=Mode.FP16), Console(quiet=True))
        fp16 = report.data["variants"][-1]["accuracy"]
        kinds.update({o["output"]: o["metric"] for o in fp16["outputs"]})
        assert fp16["ok"], fp16  # fp16 agrees with float on every output: no "100-point drop"
    assert kinds == {"boxes": "SQNR", "scores": "SQNR", "mask": "per-pixel class agreement", "logits": "top-1 agreement"}


def test_metric_flag_chooses_for_one_output(tmp_path: Path) -> None:
    path = save(build("detector"), tmp_path / "m.onnx")
    report = run_quantize(_request(path, "jetson-orin", tmp_path, mode=Mode.FP16, metric=("scores=top1",)),
                          Console(quiet=True))
    metrics = {o["output"]: o["metric"] for o in report.data["variants"][-1]["accuracy"]["outputs"]}
    assert metrics == {"boxes": "SQNR", "scores": "top-1 agreement"}


def test_opset_that_cannot_be_raised_is_kept_with_per_tensor_qdq(tmp_path: Path) -> None:
    path = save(tiny_cnn(opset=11), tmp_path / "old.onnx")

    def refuse(model: onnx.ModelProto, version: int) -> onnx.ModelProto:
        raise RuntimeError("No Adapter For Gemm")  # what onnx's converter says for an op it cannot convert

    report = run_quantize(_request(path, "cpu-x86", tmp_path, mode=Mode.INT8, convert_opset=refuse),
                          Console(quiet=True))
    assert report.model is not None and default_opset(report.model) == 11 and is_quantized(report.model)
    assert any("kept opset 11" in n and "per-tensor" in n for n in report.data["notes"])
    assert report.data["variants"][-1]["recipe"]["per_channel"] is False
    ort.InferenceSession(report.model.SerializeToString(), providers=["CPUExecutionProvider"])


def test_below_opset_10_without_conversion_is_refused(tmp_path: Path) -> None:
    path = save(tiny_cnn(opset=9), tmp_path / "old.onnx")

    def refuse(model: onnx.ModelProto, version: int) -> onnx.ModelProto:
        raise RuntimeError("No Adapter")

    with pytest.raises(ModelError, match="cannot raise opset 9 -> 10"):
        run_quantize(_request(path, "cpu-x86", tmp_path, mode=Mode.INT8, convert_opset=refuse), Console(quiet=True))


def _coreml_registry() -> Any:
    """None while quantize/recipe.py maps EPs itself; once the agent's backend registry does, that registry
    plus CoreML's EP as the onnxruntime backend declares it on macOS (when it does not already)."""
    try:
        from edgecore.backends import Runner
        from edgecore.backends.registry import Backend, BackendRegistry, Device, default_registry
    except ImportError:
        return None

    def never_opened(path: Path, device: str, options: Mapping[str, str]) -> Runner:
        raise AssertionError("the CoreML stand-in only declares the EP's family; quantize never opens it")

    registry = BackendRegistry(list(default_registry()))
    if registry.family_of("CoreMLExecutionProvider") is None:
        coreml = Device("CoreMLExecutionProvider", "coreml", precisions=("fp32", "fp16"))
        registry.register(Backend("coreml-test", open=never_opened, offered=lambda: [],
                                  runtime_version=lambda: "", accelerators={"apple": (coreml,)}))
    return registry


def _coreml_profile(folder: Path, name: str) -> None:
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.yaml").write_text(
        f"name: {name}\ndescription: test CoreML profile\nexecution_providers:\n"
        "  - name: CoreMLExecutionProvider\n    runtime: onnxruntime\n    versions: '>=1.16'\n"
        "    op_support: {source: all-except, excluded_ops: ['ai.onnx:QuantizeLinear', 'ai.onnx:DequantizeLinear']}\n"
        "  - name: CPUExecutionProvider\n    runtime: onnxruntime\n    versions: '>=1.16'\n    op_support: {source: ort-cpu}\n"
        "precision: {format: fp16, activations: fp16, weights: fp16}\nshape: {static_required: true}\n"
        "partition: {max_partitions: 4, min_partition_nodes: 1}\n")


@pytest.mark.parametrize("name,precision,why", [
    ("coreml-mlprogram", "fp16", "MLProgram format: the EP runs float16 tensors natively"),
    ("coreml-neuralnetwork", "fp32", "NeuralNetwork format: onnxruntime's CoreML EP takes float32 tensors only"),
])
def test_coreml_gets_the_format_it_runs_fastest_and_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             name: str, precision: str, why: str) -> None:
    if not (Path(__file__).parents[2] / "configs" / "targets" / f"{name}.yaml").is_file():
        _coreml_profile(tmp_path / "targets", name)
        monkeypatch.setenv("EDGECTL_TARGETS_PATH", str(tmp_path / "targets"))
    path = save(build("detector"), tmp_path / "m.onnx")
    report = run_quantize(QuantizeRequest(model=path, target=name, output=tmp_path / "o.onnx", measure=False,
                                          registry=_coreml_registry()), Console(quiet=True))
    chosen = next(v for v in report.data["variants"] if v["name"] == report.data["chosen"])
    assert chosen["recipe"]["precision"] == precision and chosen["target_check"]["ok"]
    assert any(why in n for n in report.data["notes"])
    with pytest.raises(UserError, match="mode dynamic refused for a coreml target"):
        run_quantize(QuantizeRequest(model=path, target=name, output=tmp_path / "o.onnx", mode=Mode.DYNAMIC,
                                     measure=False, registry=_coreml_registry()), Console(quiet=True))


def test_cli_files_have_umask_mode_and_runtime_warnings_go_to_a_log(tmp_path: Path) -> None:
    model = build("symbolic_batch")
    model.graph.input.append(onnx.helper.make_tensor_value_info("fc_b", onnx.TensorProto.FLOAT, [10]))
    path = save(model, tmp_path / "m.onnx")  # an initializer listed as an input: onnxruntime warns on every session
    out = tmp_path / "o.onnx"
    proc = _cli(str(path), "--target", "cpu-x86", "-o", str(out), "--calib-synthetic", "4", "--no-measure")
    assert proc.returncode == 0, proc.stderr
    umask = os.umask(0o022)
    os.umask(umask)
    for written in (out, out.with_suffix(".quant.json")):
        assert written.stat().st_mode & 0o777 == 0o666 & ~umask
    log = out.with_suffix(".quant.log")
    assert "appears in graph inputs" in log.read_text()
    assert "appears in graph inputs" not in proc.stderr
    said = "".join(proc.stderr.split())  # rich wraps lines at the terminal width, long paths mid-word
    assert "runtimelog:" in said and log.name in said and "warnings" in said
