"""NNCF post-training quantization, the INT8 OpenVINO makes itself: offered beside the QDQ model, kept where it wins.

``nncf.quantize`` on the OpenVINO model of the user's float model, with the calibration samples,
gives an IR whose FakeQuantize layers the CPU plugin runs in INT8. On OpenVINO CPU/GPU targets it
is built and measured beside the onnxruntime QDQ variant (accuracy against the user's model, latency
with OpenVINO at the precision the agent serves); the pick takes whichever is fastest within the
budget. NNCF is an optional host dependency (``pip install nncf``); without it the run says so.
"""

from __future__ import annotations

import contextlib
import io
import logging
import tempfile
from pathlib import Path

import onnx

from edgecore.errors import ModelError, one_line
from quantize.openvino_ir import IrModel
from quantize.samples import SampleSet

__all__ = ["available", "fake_quantize_layers", "quantize_nncf"]


def available() -> bool:
    """True when NNCF is installed."""
    try:
        import nncf  # noqa: F401
    except ImportError:
        return False
    return True


def quantize_nncf(model: onnx.ModelProto, calib: SampleSet) -> IrModel:
    """`model` quantized by NNCF (symmetric "performance" preset, all calibration samples) as an OpenVINO IR."""
    import nncf
    import openvino as ov

    nncf.set_log_level(logging.ERROR)
    samples = list(calib)
    with tempfile.TemporaryDirectory(prefix="edgectl-nncf-") as tmp:
        src, xml = Path(tmp) / "model.onnx", Path(tmp) / "model.xml"
        onnx.save(model, src)
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # NNCF draws its own progress bar on stdout
                quantized = nncf.quantize(ov.Core().read_model(str(src)), nncf.Dataset(samples),
                                          subset_size=len(samples), preset=nncf.QuantizationPreset.PERFORMANCE)
            ov.save_model(quantized, str(xml), compress_to_fp16=False)
        except Exception as exc:  # NNCF raises its own errors and OpenVINO's RuntimeError
            raise ModelError(f"NNCF {nncf.__version__} cannot quantize the model: {one_line(exc)[:200]}") from exc
        return IrModel(xml.read_bytes(), xml.with_suffix(".bin").read_bytes())


def fake_quantize_layers(ir: IrModel) -> int:
    """How many FakeQuantize layers the IR has (none: NNCF quantized nothing)."""
    return ir.xml.count(b'type="FakeQuantize"')

