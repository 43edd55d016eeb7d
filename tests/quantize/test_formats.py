"""Each mode x target family: the output loads in onnxruntime and follows the target's format rules."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, numpy_helper
from rich.console import Console

from edgecore.errors import UserError
from quantize import Mode, QuantizeReport, QuantizeRequest, run_quantize
from quantize.nncf_ptq import available as nncf_available

# target, mode, expected precision of the chosen variant, activation zero-point dtype, weights per-channel
CASES = [
    ("jetson-orin", Mode.INT8, "int8", np.int8, True),
    ("jetson-orin", Mode.AUTO, "int8", np.int8, True),
    ("jetson-orin", Mode.FP16, "fp16", None, None),
    ("nnapi", Mode.INT8, "int8", np.uint8, True),
    ("qnn-htp", Mode.AUTO, "int8", np.uint8, False),
    ("cpu-x86", Mode.INT8, "int8", np.uint8, True),
    ("cpu-x86", Mode.DYNAMIC, "dynamic", None, None),
    ("cpu-arm", Mode.DYNAMIC, "dynamic", None, None),
    ("myriad", Mode.AUTO, "fp16", None, None),
    ("intel-npu", Mode.INT8, "int8", np.uint8, True),
]


def _run(model: Path, target: str, mode: Mode, tmp: Path, **kw: Any) -> QuantizeReport:
    request = QuantizeRequest(model=model, target=target, output=tmp / "out.onnx", mode=mode,
                              calib_synthetic=8, measure=False, max_drop=100.0, min_db=-100.0, **kw)
    return run_quantize(request, Console(quiet=True))


def _zero_points(model: onnx.ModelProto, op: str, weights: bool) -> list[np.ndarray]:
    inits = {t.name: t for t in model.graph.initializer}
    return [numpy_helper.to_array(inits[n.input[2]]) for n in model.graph.node
            if n.op_type == op and (n.input[0] in inits) == weights and n.input[2] in inits]


@pytest.mark.parametrize("target,mode,precision,act_zp,per_channel", CASES, ids=[f"{c[0]}-{c[1].value}" for c in CASES])
def test_output_loads_and_follows_target_rules(cnn_path: Path, tmp_path: Path, target: str, mode: Mode,
                                               precision: str, act_zp: type | None, per_channel: bool | None) -> None:
    report = _run(cnn_path, target, mode, tmp_path)
    chosen = next(v for v in report.data["variants"] if v["name"] == report.data["chosen"])
    assert chosen["recipe"]["precision"] == precision
    model = report.model
    assert model is not None
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    out = session.run(None, {"x": np.zeros((1, 3, 16, 16), np.float32)})
    assert out[0].shape == (1, 10)
    if precision == "int8":
        acts = _zero_points(model, "QuantizeLinear", weights=False)
        weights = _zero_points(model, "DequantizeLinear", weights=True)
        assert acts and all(zp.dtype == act_zp for zp in acts)
        if act_zp is np.int8:  # TensorRT: symmetric everywhere
            assert all(not zp.any() for zp in acts + weights)
        assert any(zp.ndim == 1 for zp in weights) == per_channel
        assert not {n.op_type for n in model.graph.node} & {"DynamicQuantizeLinear", "MatMulInteger", "ConvInteger"}
    if precision == "fp16" and target == "myriad":  # OpenVINO's own format: an IR with FP16-compressed weights
        assert report.ir is not None and report.ir.fp16_share() == 1.0 and chosen["recipe"]["container"] == "openvino-ir"
    elif precision == "fp16":
        assert model.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT  # fp32 I/O kept
        assert any(t.data_type == TensorProto.FLOAT16 for t in model.graph.initializer)
    if precision == "dynamic":
        assert {"DynamicQuantizeLinear"} <= {n.op_type for n in model.graph.node} or \
            {"ConvInteger", "MatMulInteger"} & {n.op_type for n in model.graph.node}


@pytest.mark.parametrize("target", ["jetson-orin", "nnapi", "qnn-htp", "myriad"])
def test_dynamic_refused_with_reason_for_accelerators(cnn_path: Path, tmp_path: Path, target: str) -> None:
    with pytest.raises(UserError, match="mode dynamic refused"):
        _run(cnn_path, target, Mode.DYNAMIC, tmp_path)


def test_reduce_range_only_without_vnni(cnn_path: Path, tmp_path: Path, plain_cpuinfo: Path,
                                        vnni_cpuinfo: Path) -> None:
    plain = _run(cnn_path, "cpu-x86", Mode.INT8, tmp_path, cpuinfo=plain_cpuinfo)
    vnni = _run(cnn_path, "cpu-x86", Mode.INT8, tmp_path, cpuinfo=vnni_cpuinfo)
    assert plain.data["variants"][-1]["recipe"]["reduce_range"] is True
    assert vnni.data["variants"][-1]["recipe"]["reduce_range"] is False
    assert plain.data["host_cpu"] == {"x86": True, "vnni": False}


def test_fp16_io_converted_when_asked(cnn_path: Path, tmp_path: Path) -> None:
    report = _run(cnn_path, "cpu-x86", Mode.FP16, tmp_path, fp16_io=True)
    assert report.model is not None
    assert report.model.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT16


def test_auto_on_cpu_measures_three_variants_and_never_picks_slower(cnn_path: Path, tmp_path: Path,
                                                                    cnn_calib: Path) -> None:
    request = QuantizeRequest(model=cnn_path, target="cpu-x86", output=tmp_path / "o.onnx", calib_dir=cnn_calib)
    report = run_quantize(request, Console(quiet=True))
    variants = {v["name"]: v for v in report.data["variants"]}
    assert set(variants) == {"float", "int8", "int8-compute"}
    chosen = variants[report.data["chosen"]]
    assert chosen["latency"]["ort_ms"] <= variants["float"]["latency"]["ort_ms"]
    # timed with the runtime the target runs, onnxruntime; OpenVINO's figure is for OpenVINO targets
    assert all(v["latency"]["ort_ms"] is not None and v["latency"]["openvino_ms"] is None for v in variants.values())
    assert all(v["size_ratio"] > 0 for v in variants.values())


def test_openvino_runs_at_the_precision_the_agent_serves(cnn_path: Path) -> None:
    import openvino as ov

    from edgecore.backends.openvino import DEFAULT_CONFIG
    from quantize.openvino_ir import compile_cpu

    compiled = compile_cpu(cnn_path)
    assert DEFAULT_CONFIG["CPU"]["INFERENCE_PRECISION_HINT"] == "f32"
    assert compiled.get_property("INFERENCE_PRECISION_HINT") == ov.Type.f32  # never the bf16 a CPU may prefer


@pytest.mark.skipif(not nncf_available(), reason="nncf not installed (pip install 'edgectl[host]')")
def test_openvino_cpu_auto_measures_qdq_and_nncf_int8_and_picks_by_openvino_latency(cnn_path: Path, tmp_path: Path,
                                                                                   cnn_calib: Path) -> None:
    request = QuantizeRequest(model=cnn_path, target="cpu-x86-openvino", output=tmp_path / "o.onnx", calib_dir=cnn_calib,
                              max_drop=100.0, min_db=-100.0)
    report = run_quantize(request, Console(quiet=True))
    variants = {v["name"]: v for v in report.data["variants"]}
    assert set(variants) == {"float", "int8", "int8-nncf"}
    nncf = variants["int8-nncf"]
    assert nncf["recipe"]["container"] == "openvino-ir" and nncf["latency"]["ort_ms"] is None
    fastest = min(variants.values(), key=lambda v: v["latency"]["openvino_ms"] * (1.0 if v["name"] == "float" else 1.03))
    assert report.data["chosen"] == fastest["name"]
    if report.data["chosen"] == "int8-nncf":
        assert report.ir is not None and report.ir.xml.count(b'type="FakeQuantize"') > 0


@pytest.mark.parametrize("target", ["nnapi", "cpu-x86"])
def test_a_constant_first_matmul_input_is_a_weight_as_onnxruntime_quantizes_it(tmp_path: Path, target: str) -> None:
    """Two detectors failed with exit 1 "zero point int8" here: onnxruntime gives MatMul's constant input 0 the weight type."""
    from onnx import helper

    from tests.corpus import detector

    model = detector()
    for node in model.graph.node:
        if node.output[0] == "boxes":
            node.output[0] = "boxes_raw"
    model.graph.initializer.append(numpy_helper.from_array(
        np.random.default_rng(0).random((8, 128), np.float32), "mix"))  # e.g. an anchor transform
    model.graph.node.append(helper.make_node("MatMul", ["mix", "boxes_raw"], ["boxes"], "decode"))
    del model.graph.output[0]
    model.graph.output.insert(0, helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, 8, 4]))
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    report = _run(path, target, Mode.INT8, tmp_path)
    assert report.data["chosen"] == "int8" and report.model is not None
    zps = [numpy_helper.to_array(i) for i in report.model.graph.initializer if i.name == "mix_zero_point"]
    assert zps and zps[0].dtype == np.int8  # the weight type: what the format rules now expect
