"""Open Inference Protocol gRPC messages to tensors and back.

An infer request carries each input either in ``raw_input_contents`` (one entry per input, in
order: little-endian elements, BYTES elements length-prefixed, as the HTTP binary extension) or in
the input's typed ``contents`` field; answers always use ``raw_output_contents``, as Triton does,
so FP16 and non-UTF-8 BYTES travel exactly. Tensor checks and byte layouts are the HTTP codec's
(``kserve``), so both protocols accept and refuse the same tensors.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from agent.serving.kserve import InferRequest, array_from_raw, array_to_raw, check_input, datatype_of, numpy_dtype
from agent.serving.oip import inference_pb2 as pb
from edgecore.backends.base import TensorSpec
from edgecore.errors import UserError

__all__ = ["decode_infer", "encode_infer", "typed_bytes"]

# The typed contents field of each datatype (FP16 has none: raw contents only).
_CONTENTS_FIELD = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}


def decode_infer(request: pb.ModelInferRequest, inputs: list[TensorSpec]) -> InferRequest:
    """The feeds and asked outputs of an infer request, checked against the model's inputs."""
    specs = {spec.name: spec for spec in inputs}
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise UserError(f"raw_input_contents has {len(raw)} entries for {len(request.inputs)} inputs; "
                        "give one per input, or use contents for all")
    feeds: dict[str, np.ndarray] = {}
    for i, tensor in enumerate(request.inputs):
        datatype, shape = check_input(tensor.name, tensor.datatype, list(tensor.shape), specs)
        if tensor.name in feeds:
            raise UserError(f"input '{tensor.name}' is given twice")
        if raw:
            feeds[tensor.name] = array_from_raw(tensor.name, datatype, shape, raw[i])
        else:
            feeds[tensor.name] = _from_contents(tensor, datatype, shape)
    outputs = [out.name for out in request.outputs] if request.outputs else None
    return InferRequest(feeds=feeds, outputs=outputs, binary_choice={}, binary_default=True,
                        request_id=request.id or None)


def typed_bytes(request: pb.ModelInferRequest) -> int:
    """Bytes of the request's typed contents (each becomes a Python object while it is decoded)."""
    return sum(tensor.contents.ByteSize() for tensor in request.inputs if tensor.HasField("contents"))


def _from_contents(tensor: pb.ModelInferRequest.InferInputTensor, datatype: str, shape: list[int]) -> np.ndarray:
    field = _CONTENTS_FIELD.get(datatype)
    if field is None:
        raise UserError(f"input '{tensor.name}': {datatype} has no typed contents field; send it in raw_input_contents")
    values = getattr(tensor.contents, field)
    count = math.prod(shape)
    if len(values) != count:
        raise UserError(f"input '{tensor.name}' has {len(values)} elements in {field}; shape {shape} needs {count}")
    if datatype == "BYTES":
        return np.array(list(values), dtype=object).reshape(shape)
    try:
        return np.array(values, dtype=numpy_dtype(datatype)).reshape(shape)
    except OverflowError as exc:
        raise UserError(f"input '{tensor.name}': a value in {field} does not fit {datatype}: {exc}") from exc


def encode_infer(model: str, version: str, results: Mapping[str, np.ndarray], request: InferRequest) -> pb.ModelInferResponse:
    """The infer response: the asked outputs (all, when none were asked) in raw_output_contents."""
    names = request.outputs if request.outputs is not None else list(results)
    response = pb.ModelInferResponse(model_name=model, model_version=version, id=request.request_id or "")
    for name in names:
        if name not in results:
            raise UserError(f"unknown output '{name}': the model's outputs are {sorted(results)}")
        value = results[name]
        if not isinstance(value, np.ndarray):
            raise UserError(f"output '{name}' is not a tensor ({type(value).__name__}) and cannot be served")
        dtype = str(value.dtype) if value.dtype.kind not in "OUS" else "object"
        response.outputs.add(name=name, datatype=datatype_of(dtype), shape=value.shape)
        response.raw_output_contents.append(array_to_raw(value))
    return response
