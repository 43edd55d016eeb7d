"""Each corpus trait: the figure quantize reports is the figure this test computes itself, and damage is refused.

For every trait of tests/corpus.py the written file and the user's model are run here on the same
evaluation samples (onnxruntime, or OpenVINO for an IR) and scored with the metric that fits the
output, in numpy written here, not with quantize's own scoring. The reported figure must be within
TOLERANCE of it. Then one weight tensor of the written file is zeroed and
``quantize.pipeline.verify_model`` (the pipeline's own judge: same reference, metrics, budget) must
refuse it, while it accepts the file as written.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from edgecore.errors import ModelError
from quantize import Mode, QuantizeRequest
from quantize.openvino_ir import IrModel
from quantize.pipeline import attempt_quantize, verify_model
from tests.corpus import CORPUS, write_corpus

TOLERANCE = {"points": 0.5, "dB": 0.1}  # reported vs computed here, on the same samples
CALIBRATION = 32  # samples: enough to span the evaluation samples' ranges (see _request)
Arrays = list[np.ndarray]

# trait -> (target, mode, budget and --metric, expected metric per output)
TRAITS: dict[str, tuple[str, Mode, dict[str, Any], dict[str, str]]] = {
    "upsample_opset9": ("cpu-x86", Mode.INT8, {"max_drop": 5.0}, {"mask": "pixel"}),
    "regression_head": ("jetson-orin", Mode.INT8, {"min_db": 25.0}, {"age": "sqnr"}),
    "detector_background": ("cpu-x86", Mode.INT8, {"max_drop": 10.0}, {"boxes": "detection", "scores": "detection"}),
    "landmarks": ("nnapi", Mode.INT8, {"min_db": 25.0}, {"landmarks": "sqnr"}),
    "image_to_image": ("nnapi", Mode.INT8, {"min_db": 30.0}, {"enhanced": "psnr"}),
    "attention": ("jetson-orin", Mode.INT8, {"min_db": 20.0}, {"context": "sqnr", "score": "sqnr"}),
    "lstm": ("myriad", Mode.AUTO, {"min_db": 30.0}, {"out": "sqnr"}),
    # its random classifier answers one class for every input, which no damage can change: judged by SQNR
    "if_convs": ("myriad", Mode.AUTO, {"min_db": 30.0, "metric": ("logits=sqnr",)}, {"logits": "sqnr"}),
    "already_quantized": ("cpu-x86", Mode.AUTO, {"max_drop": 5.0}, {"logits": "top1"}),
}
TITLES = {"pixel": "per-pixel class agreement", "sqnr": "SQNR", "psnr": "PSNR", "top1": "top-1 agreement",
          "detection": "confident-detection agreement"}


def _feeds(name: str, seed: int) -> dict[str, np.ndarray]:
    """The corpus's inputs with a brightness and contrast of their own, as real samples differ.

    The detector keeps the corpus's own: its confident predictions follow the inputs' brightness.
    """
    if name == "detector_background":
        return CORPUS[name].feeds(seed)
    rng = np.random.default_rng(seed + 1000)
    return {k: (v * rng.uniform(0.2, 1.0) + rng.uniform(-0.5, 0.5)).astype(np.float32) if v.dtype == np.float32 else v
            for k, v in CORPUS[name].feeds(seed).items()}


def _folder(tmp: Path, name: str, seeds: range) -> Path:
    folder = tmp / f"{name}-{seeds.start}"
    folder.mkdir()
    for seed in seeds:
        arrays: dict[str, Any] = _feeds(name, seed)  # Any: numpy's stub reads ** as its allow_pickle keyword
        np.savez(folder / f"{seed:03d}.npz", **arrays)
    return folder


def _request(tmp: Path, name: str) -> QuantizeRequest:
    """Calibration on CALIBRATION samples, evaluation on 6 others.

    The calibration must cover the evaluation's brightness and contrast, as a user's does: with 8 samples
    the regression head's eval outputs reach 0.64 where calibration saw at most 0.41, INT8 clips them
    (SQNR 10.8 dB, the figure this test computes too) and quantize rightly writes nothing.
    """
    target, mode, budget, _ = TRAITS[name]
    path = write_corpus(tmp, [name])[name]
    return QuantizeRequest(model=path, target=target, output=tmp / "out.onnx", mode=mode, measure=False,
                           calib_dir=_folder(tmp, name, range(CALIBRATION)), eval_dir=_folder(tmp, name, range(100, 106)),
                           static_shape=tuple(CORPUS[name].static_shape_args()), **budget)


def _run(model: onnx.ModelProto | IrModel, names: list[str], feeds: list[dict[str, np.ndarray]]) -> list[Arrays]:
    """Each output over the samples, run here: onnxruntime for ONNX, OpenVINO CPU at f32 for an IR."""
    if isinstance(model, IrModel):
        import openvino as ov

        core = ov.Core()
        read = core.read_model(model=model.xml.decode(), weights=ov.Tensor(np.frombuffer(model.weights, np.uint8)))
        compiled = core.compile_model(read, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
        runs = [compiled.create_infer_request().infer(f) for f in feeds]
        ports = {n: p for p in compiled.outputs for n in p.get_names()}
        return [[np.array(r[ports[n]]) for r in runs] for n in names]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    runs = [session.run(names, f) for f in feeds]
    return [[r[i] for r in runs] for i in range(len(names))]


def _sqnr(ref: Arrays, got: Arrays) -> float:
    signal = sum(float(np.sum(r.astype(np.float64) ** 2)) for r in ref)
    noise = sum(float(np.sum((r.astype(np.float64) - g) ** 2)) for r, g in zip(ref, got, strict=True))
    return 100.0 if noise == 0 else min(100.0, 10 * math.log10(signal / noise))


def _psnr(ref: Arrays, got: Arrays) -> float:
    peak = max(float(r.max()) for r in ref) - min(float(r.min()) for r in ref)
    mse = float(np.mean([np.mean((r.astype(np.float64) - g) ** 2) for r, g in zip(ref, got, strict=True)]))
    return 100.0 if mse == 0 else min(100.0, 10 * math.log10(peak * peak / mse))


def _argmax_agreement(ref: Arrays, got: Arrays, axis: int) -> float:
    return 100.0 * float(np.mean([np.mean(r.argmax(axis) == g.argmax(axis)) for r, g in zip(ref, got, strict=True)]))


def _detection(boxes: tuple[Arrays, Arrays], scores: tuple[Arrays, Arrays]) -> float:
    """Anchor by anchor (the corpus detector's anchors never overlap at IoU 0.9): confident in both, same box, same score."""
    agree = total = 0
    for rb, gb, rs, gs in zip(*boxes, *scores, strict=True):
        ref_on, got_on = rs[0, :, 1] >= 0.5, gs[0, :, 1] >= 0.5
        lo, hi = np.maximum(rb[0, :, :2], gb[0, :, :2]), np.minimum(rb[0, :, 2:], gb[0, :, 2:])
        inter = np.prod(np.clip(hi - lo, 0, None), -1)
        union = np.prod(rb[0, :, 2:] - rb[0, :, :2], -1) + np.prod(gb[0, :, 2:] - gb[0, :, :2], -1) - inter
        same = (inter / union >= 0.9) & (np.abs(rs[0, :, 1] - gs[0, :, 1]) <= 0.1)
        agree += int(np.sum(ref_on & got_on & same))
        total += int(ref_on.sum() + got_on.sum())
    return 100.0 if total == 0 else 200.0 * agree / total


def _expected(kind: str, name: str, ref: dict[str, Arrays], got: dict[str, Arrays]) -> float:
    if kind == "sqnr":
        return _sqnr(ref[name], got[name])
    if kind == "psnr":
        return _psnr(ref[name], got[name])
    if kind == "pixel":
        return _argmax_agreement(ref[name], got[name], 1)
    if kind == "top1":
        return _argmax_agreement(ref[name], got[name], -1)
    return _detection((ref["boxes"], got["boxes"]), (ref["scores"], got["scores"]))


def _zero_one_weight(model: onnx.ModelProto | IrModel) -> onnx.ModelProto | IrModel:
    """The same file with the weights of its last weighted layer (the one nearest the outputs) set to zero.

    For an OpenVINO IR, whose layers this test does not parse, every FP16 constant (its weights).
    """
    if isinstance(model, IrModel):
        weights = bytearray(model.weights)
        for offset, size in re.findall(rb'<data element_type="f16"[^>]*offset="(\d+)"[^>]*size="(\d+)"', model.xml):
            weights[int(offset):int(offset) + int(size)] = bytes(int(size))
        return IrModel(model.xml, bytes(weights))
    damaged = onnx.ModelProto()
    damaged.CopyFrom(model)
    inits = {t.name: t for t in damaged.graph.initializer}
    producers = {o: n for n in damaged.graph.node for o in n.output}
    last = next(n for n in reversed(damaged.graph.node) if n.op_type in ("Conv", "Gemm", "MatMul")
                and any(_weight_of(i, inits, producers) is not None for i in n.input))
    weight = next(w for w in (_weight_of(i, inits, producers) for i in last.input) if w is not None)
    weight.CopyFrom(numpy_helper.from_array(np.zeros_like(numpy_helper.to_array(weight)), weight.name))
    return damaged


def _weight_of(name: str, inits: dict[str, onnx.TensorProto],
               producers: dict[str, onnx.NodeProto]) -> onnx.TensorProto | None:
    """The initializer behind input `name`: itself, or what a DequantizeLinear/Cast reads (not scales, biases)."""
    if name in inits and len(inits[name].dims) >= 2:
        return inits[name]
    node = producers.get(name)
    if node is not None and node.op_type in ("DequantizeLinear", "Cast") and node.input[0] in inits:
        return inits[node.input[0]] if len(inits[node.input[0]].dims) >= 2 else None
    return None


@pytest.mark.parametrize("name", sorted(TRAITS))
def test_reported_figure_is_the_independent_one_and_damage_is_refused(tmp_path: Path, name: str) -> None:
    request = _request(tmp_path, name)
    outcome = attempt_quantize(request)
    assert outcome.written, outcome.failure
    report = outcome.report
    assert report.model is not None
    written = report.ir if report.ir is not None else report.model
    chosen = next(v for v in report.data["variants"] if v["name"] == report.data["chosen"])
    scores = {s["output"]: s for s in chosen["accuracy"]["outputs"]}
    names = list(TRAITS[name][3])
    feeds = [_feeds(name, seed) for seed in range(100, 106)]
    ref = dict(zip(names, _run(onnx.load(request.model), names, feeds), strict=True))
    got = dict(zip(names, _run(written, names, feeds), strict=True))
    for output, kind in TRAITS[name][3].items():
        score = scores[output]
        assert score["metric"] == TITLES[kind], score
        expected = _expected(kind, output, ref, got)
        assert abs(score["value"] - expected) <= TOLERANCE[score["unit"]], (output, score["value"], expected)
    assert verify_model(request, written).ok  # the pipeline's judge accepts the file as written
    damaged = verify_model(request, _zero_one_weight(written))
    assert not damaged.ok, damaged.to_dict()


def test_upsample_rewrite_is_checked_against_the_users_model(tmp_path: Path) -> None:
    report = attempt_quantize(_request(tmp_path, "upsample_opset9")).report
    rewrites = report.data["reference"]["rewrites"]
    assert rewrites["faithful"] and rewrites["steps"][0] == "opset raised 9 -> 13 with onnx.version_converter"


def test_a_rewrite_that_changes_outputs_is_reported_with_its_figure(tmp_path: Path) -> None:
    """A converter that changes the model (as onnx's does to Upsample without the fix): said, with the figure."""
    from onnx import version_converter

    def changing(model: onnx.ModelProto, version: int) -> onnx.ModelProto:
        converted = version_converter.convert_version(model, version)
        weight = next(t for t in converted.graph.initializer if t.name == "w2")
        weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight) * 1.3, "w2"))
        return converted

    request = _request(tmp_path, "upsample_opset9")
    outcome = attempt_quantize(replace(request, convert_opset=changing, max_drop=100.0))
    rewrites = outcome.report.data["reference"]["rewrites"]
    assert not rewrites["faithful"] and rewrites["sqnr_db"] < 60.0
    warning = next(n for n in outcome.report.data["notes"] if "CHANGE your model's outputs" in n)
    assert f"SQNR {rewrites['sqnr_db']:.1f} dB" in warning
    float_variant = outcome.report.data["variants"][0]
    assert float_variant["accuracy"]["value"] == 100.0  # the float model written is the user's, not the rewrite


@pytest.mark.parametrize("target", ["cpu-x86", "jetson-orin", "nnapi", "myriad", "coreml-mlprogram"])
def test_a_model_onnxruntime_cannot_load_is_refused_never_repaired(tmp_path: Path, target: str) -> None:
    path = write_corpus(tmp_path, ["unloadable"])["unloadable"]
    with pytest.raises(ModelError, match=r"onnxruntime [\d.]+ cannot load the model as given \(.*Type Error.*\); "
                                         "every figure is measured against your model, so it is not rewritten"):
        attempt_quantize(QuantizeRequest(model=path, target=target, output=tmp_path / "o.onnx", calib_synthetic=2,
                                         measure=False))


@pytest.mark.parametrize("mode", [Mode.INT8, Mode.FP16])
def test_an_already_quantized_model_is_kept_under_auto_and_refused_otherwise(tmp_path: Path, mode: Mode) -> None:
    path = write_corpus(tmp_path, ["already_quantized"])["already_quantized"]
    with pytest.raises(ModelError, match=r"already quantized .*--mode auto to keep it as it is"):
        attempt_quantize(QuantizeRequest(model=path, target="cpu-x86", output=tmp_path / "o.onnx", mode=mode,
                                         calib_synthetic=2, measure=False))
