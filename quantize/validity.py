"""A file is written only when the runtimes that will read it accept it: the checks every variant passes first.

- ONNX: ``onnx.checker.check_model(full_check=True)`` (structure, topological order, strict shape
  inference), onnxruntime's CPU provider loads it, and for OpenVINO targets OpenVINO's CPU plugin
  compiles it;
- OpenVINO IR: OpenVINO reads and compiles it (scoring runs it there), and for MYRIAD the 2022.3
  runtime can read its operation sets (``quantize.openvino_ir.myriad_problem``).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import onnx

from edgecore.errors import ModelError, one_line
from quantize.openvino_ir import compile_cpu
from quantize.source import runtime_refusal

__all__ = ["onnx_problems"]

_IN_MEMORY_LIMIT = 2**31 - 1  # protobuf's limit: bigger models are checked from a file


def onnx_problems(model: onnx.ModelProto, openvino: bool) -> list[str]:
    """Why `model` must not be written (empty when onnx's full check, onnxruntime and, if asked, OpenVINO accept it)."""
    problems = []
    with tempfile.TemporaryDirectory(prefix="edgectl-valid-") as tmp:
        path = Path(tmp) / "model.onnx"
        onnx.save(model, path, save_as_external_data=model.ByteSize() > _IN_MEMORY_LIMIT)
        try:
            onnx.checker.check_model(str(path), full_check=True)
        except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
            problems.append(f"onnx.checker (full check) refuses it: {one_line(exc)[:200]}")
        refused = runtime_refusal(model)
        if refused is not None:
            problems.append(f"onnxruntime cannot load it: {refused}")
        if openvino:
            try:
                compile_cpu(path)
            except ModelError as exc:
                problems.append(str(exc))
    return problems
