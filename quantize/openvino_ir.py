"""OpenVINO IR, the format Intel targets run natively: export, run, and what OpenVINO really does with a model.

For MYRIAD and NPU the variant is the float model converted by OpenVINO and saved with its weights
compressed to FP16 (``ov.save_model(..., compress_to_fp16=True)``): the graph is the user's, every
float constant is stored in FP16, and the device computes in FP16, without the hundreds of Cast
pairs an fp16 ONNX conversion inserts. MYRIAD is served by the OpenVINO 2022.3 LTS runtime only
(the last release with its plugin), which reads IR v11 with operation sets up to opset10: an IR
using a newer operation set cannot load there, and ``myriad_problem`` says so.

Models run here on OpenVINO's CPU plugin with the configuration the agent serves with
(``edgecore.backends.openvino.DEFAULT_CONFIG``: f32 inference precision, so a CPU with bf16 does not
silently trade accuracy for speed).
"""

from __future__ import annotations

import re
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from edgecore.errors import ModelError, one_line
from quantize.samples import SampleSet

__all__ = ["MYRIAD_MAX_OPSET", "IrModel", "compile_cpu", "export_ir", "myriad_problem", "precision_report",
           "run_openvino"]

MYRIAD_MAX_OPSET = 10  # OpenVINO 2022.3 LTS reads operation sets opset1..opset10
Outputs = list[list[np.ndarray]]


@dataclass(frozen=True)
class IrModel:
    """An OpenVINO IR in memory: the XML topology and its weights file."""

    xml: bytes
    weights: bytes

    @property
    def size(self) -> int:
        """Bytes of both files."""
        return len(self.xml) + len(self.weights)

    def opsets(self) -> dict[int, list[str]]:
        """The operation types used, by operation-set number (from the XML's layer versions)."""
        found: dict[int, set[str]] = {}
        for layer_type, version in re.findall(rb'<layer [^>]*type="([^"]+)"[^>]*version="opset(\d+)"', self.xml):
            found.setdefault(int(version), set()).add(layer_type.decode())
        return {k: sorted(v) for k, v in sorted(found.items())}

    def fp16_share(self) -> float:
        """Share of the float constants' elements stored as FP16."""
        sizes: Counter[str] = Counter()
        for op in _read(self).get_ops():
            if op.get_type_name() == "Constant":
                kind = op.get_output_element_type(0).get_type_name()
                if kind in ("f16", "f32"):
                    sizes[kind] += int(np.prod(list(op.get_output_shape(0)), dtype=np.int64))
        total = sizes["f16"] + sizes["f32"]
        return sizes["f16"] / total if total else 0.0

    def write(self, xml_path: Path, write: Any) -> Path:
        """Write XML and weights (``.bin`` beside it) with `write(path, bytes)`; returns the weights path."""
        bin_path = xml_path.with_suffix(".bin")
        write(bin_path, self.weights)  # the weights first: an XML never points at a missing .bin
        write(xml_path, self.xml)
        return bin_path


def export_ir(model: onnx.ModelProto, compress_to_fp16: bool) -> IrModel:
    """`model` converted by OpenVINO and saved as IR (FP16-compressed weights when asked)."""
    import openvino as ov

    with tempfile.TemporaryDirectory(prefix="edgectl-ir-") as tmp:
        src, xml = Path(tmp) / "model.onnx", Path(tmp) / "model.xml"
        onnx.save(model, src)
        try:
            ov.save_model(ov.convert_model(str(src)), str(xml), compress_to_fp16=compress_to_fp16)
        except Exception as exc:  # OpenVINO's frontend raises its own OpConversionFailure/RuntimeError
            raise ModelError(f"OpenVINO {ov.__version__.split('-')[0]} cannot convert the model: {_reason(exc)}") from exc
        return IrModel(xml.read_bytes(), xml.with_suffix(".bin").read_bytes())


def myriad_problem(ir: IrModel) -> str | None:
    """Why OpenVINO 2022.3 (the MYRIAD runtime) cannot read `ir`, or None."""
    newer = {v: ops for v, ops in ir.opsets().items() if v > MYRIAD_MAX_OPSET}
    if not newer:
        return None
    version, ops = max(newer.items())
    return (f"the IR uses opset{version} operations ({', '.join(ops[:4])}) that the OpenVINO 2022.3 runtime MYRIAD "
            f"needs cannot read (it knows opset1..opset{MYRIAD_MAX_OPSET})")


def compile_cpu(model: Any) -> Any:
    """`model` (an ONNX path, an IrModel or an ov.Model) compiled for OpenVINO's CPU plugin as the agent serves it."""
    import openvino as ov

    from edgecore.backends.openvino import DEFAULT_CONFIG

    core = ov.Core()
    try:
        read = _read(model) if isinstance(model, IrModel) else core.read_model(str(model)) if isinstance(model, Path) \
            else model
        return core.compile_model(read, "CPU", dict(DEFAULT_CONFIG.get("CPU", {})))
    except Exception as exc:  # OpenVINO raises RuntimeError and its own conversion errors
        raise ModelError(f"OpenVINO {ov.__version__.split('-')[0]} cannot load it: {_reason(exc)}") from exc


def run_openvino(model: IrModel | Path, names: list[str], samples: SampleSet) -> Outputs:
    """Every output (in the order of `names`, the user's model's outputs) for every sample, on OpenVINO's CPU."""
    compiled = compile_cpu(model)
    ports = {n: p for p in compiled.outputs for n in p.get_names()}
    missing = [n for n in names if n not in ports]
    if missing:
        raise ModelError(f"the OpenVINO model has no output {missing[0]!r}")
    request = compiled.create_infer_request()
    inputs = {n for p in compiled.inputs for n in p.get_names()}
    results = []
    for feeds in samples:
        out = request.infer({k: v for k, v in feeds.items() if k in inputs})
        results.append([np.array(out[ports[n]]) for n in names])
    return results


def precision_report(model: IrModel | Path) -> str:
    """What OpenVINO's CPU plugin really runs: its inference precision and the precision of its compute layers."""
    compiled = compile_cpu(model)
    hint = compiled.get_property("INFERENCE_PRECISION_HINT")
    hint = hint.get_type_name() if hasattr(hint, "get_type_name") else str(hint)
    layers: Counter[str] = Counter()
    for op in compiled.get_runtime_model().get_ops():
        info = op.get_rt_info()
        kind = str(info["layerType"].astype(str)) if "layerType" in info else ""
        if kind in ("Convolution", "FullyConnected", "MatMul", "GroupConvolution", "Deconvolution"):
            layers[str(info["runtimePrecision"].astype(str)) if "runtimePrecision" in info else "?"] += 1
    parts = ", ".join(f"{count} in {precision}" for precision, count in layers.most_common()) or "none"
    return f"inference precision {hint}; compute layers (conv/matmul/fully connected): {parts}"


def _read(ir: IrModel) -> Any:
    import openvino as ov

    return ov.Core().read_model(model=ir.xml.decode(), weights=ov.Tensor(np.frombuffer(ir.weights, np.uint8)))


def _reason(exc: BaseException) -> str:
    # OpenVINO's first line is often a source location; the reason is in the following lines.
    lines = [line.strip() for line in str(exc).splitlines() if line.strip() and "src/" not in line]
    return (" ".join(lines[:2]) or one_line(exc))[:240]
