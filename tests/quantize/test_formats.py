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

from agent.errors import UserError
from quantize import Mode, QuantizeReport, QuantizeRequest, run_quantize

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
                              calib_synthetic=8, measure=False, max_drop=100.0, **kw)
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
    if precision == "fp16":
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
    report = _run(cnn_path, "myriad", Mode.FP16, tmp_path, fp16_io=True)
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
    assert all(v["latency"]["openvino_ms"] is not None for v in variants.values())
    assert all(v["size_ratio"] > 0 for v in variants.values())
