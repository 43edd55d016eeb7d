"""KServe v2 / Open Inference Protocol codec: JSON tensors and the binary tensor data extension.

Requests may carry tensors inline (``"data"``) or as raw bytes after the JSON header, whose length
the ``Inference-Header-Content-Length`` HTTP header gives; each binary input says its size in
``parameters.binary_data_size``. Responses use the same layout when the client asks for binary
outputs (``parameters.binary_data_output`` or per output ``parameters.binary_data``).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from agent.backends.base import TensorSpec
from agent.errors import UserError

__all__ = [
    "InferRequest",
    "datatype_of",
    "encode_response",
    "parse_request",
    "tensor_metadata",
]

_DATATYPES = {
    "BOOL": "bool",
    "UINT8": "uint8",
    "UINT16": "uint16",
    "UINT32": "uint32",
    "UINT64": "uint64",
    "INT8": "int8",
    "INT16": "int16",
    "INT32": "int32",
    "INT64": "int64",
    "FP16": "float16",
    "FP32": "float32",
    "FP64": "float64",
    "BYTES": "object",
}
_NUMPY_TO_DATATYPE = {v: k for k, v in _DATATYPES.items()}


@dataclass
class InferRequest:
    """A decoded infer request: feeds, which outputs to return and how."""

    feeds: dict[str, np.ndarray]
    outputs: list[str] | None
    binary_outputs: set[str]
    binary_default: bool
    request_id: str | None


def datatype_of(dtype: str) -> str:
    """KServe datatype name of a numpy dtype string (``float32`` -> ``FP32``)."""
    return _NUMPY_TO_DATATYPE.get(dtype, "BYTES")


def tensor_metadata(spec: TensorSpec) -> dict[str, Any]:
    """Model-metadata entry of one tensor; unknown and symbolic dims are -1."""
    shape = [dim if isinstance(dim, int) else -1 for dim in spec.shape]
    return {"name": spec.name, "datatype": datatype_of(spec.dtype), "shape": shape}


def parse_request(body: bytes, header_length: int | None, inputs: list[TensorSpec]) -> InferRequest:
    """Decode and validate an infer request body against the model inputs."""
    header_bytes = body if header_length is None else body[:header_length]
    if header_length is not None and not 0 <= header_length <= len(body):
        raise UserError(f"Inference-Header-Content-Length {header_length} exceeds the body ({len(body)} bytes)")
    try:
        header = json.loads(header_bytes)
    except (ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"request JSON is malformed: {exc}") from exc
    if not isinstance(header, dict) or not isinstance(header.get("inputs"), list):
        raise UserError("request must be a JSON object with an 'inputs' list")
    specs = {spec.name: spec for spec in inputs}
    binary = memoryview(body)[len(header_bytes):] if header_length is not None else memoryview(b"")
    feeds: dict[str, np.ndarray] = {}
    offset = 0
    for tensor in header["inputs"]:
        name, array, used = _decode_input(tensor, specs, binary, offset)
        feeds[name] = array
        offset += used
    if offset != len(binary):
        raise UserError(f"binary data is {len(binary)} bytes but the inputs declare {offset}")
    return _request(header, feeds)


def _request(header: dict[str, Any], feeds: dict[str, np.ndarray]) -> InferRequest:
    params = header.get("parameters") or {}
    requested = header.get("outputs")
    outputs = None
    binary_outputs: set[str] = set()
    if isinstance(requested, list):
        outputs = [str(out.get("name")) for out in requested if isinstance(out, dict)]
        binary_outputs = {
            str(out.get("name"))
            for out in requested
            if isinstance(out, dict) and (out.get("parameters") or {}).get("binary_data")
        }
    request_id = header.get("id")
    return InferRequest(
        feeds=feeds,
        outputs=outputs,
        binary_outputs=binary_outputs,
        binary_default=bool(params.get("binary_data_output", False)),
        request_id=str(request_id) if request_id is not None else None,
    )


def _decode_input(
    tensor: Any, specs: Mapping[str, TensorSpec], binary: memoryview, offset: int
) -> tuple[str, np.ndarray, int]:
    """One input tensor as an array, and how many binary bytes it consumed."""
    if not isinstance(tensor, dict) or not isinstance(tensor.get("name"), str):
        raise UserError("each input must be an object with a 'name'")
    name = tensor["name"]
    spec = specs.get(name)
    if spec is None:
        raise UserError(f"unknown input '{name}': the model's inputs are {sorted(specs)}")
    want = datatype_of(spec.dtype)
    if tensor.get("datatype") != want:
        raise UserError(f"input '{name}' expects datatype {want}, got {tensor.get('datatype')}")
    shape = tensor.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise UserError(f"input '{name}' needs a 'shape' list of non-negative integers")
    size = (tensor.get("parameters") or {}).get("binary_data_size")
    if size is not None:
        if not isinstance(size, int) or size < 0 or offset + size > len(binary):
            raise UserError(f"input '{name}' declares {size} binary bytes; {len(binary) - offset} remain")
        return name, _from_binary(name, want, shape, binary[offset:offset + size]), size
    if "data" not in tensor:
        raise UserError(f"input '{name}' has neither 'data' nor binary_data_size")
    return name, _from_json(name, want, shape, tensor["data"]), 0


def _from_binary(name: str, datatype: str, shape: list[int], raw: memoryview) -> np.ndarray:
    count = int(np.prod(shape, dtype=np.int64))
    if datatype == "BYTES":
        return _bytes_elements(name, shape, count, raw)
    dtype = np.dtype(_DATATYPES[datatype])
    if len(raw) != count * dtype.itemsize:
        raise UserError(
            f"input '{name}' has {len(raw)} bytes; shape {shape} {datatype} needs {count * dtype.itemsize}"
        )
    # Zero-copy view of the request body; read-only is fine for every backend.
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def _bytes_elements(name: str, shape: list[int], count: int, raw: memoryview) -> np.ndarray:
    items: list[str] = []
    pos = 0
    while pos < len(raw):
        if pos + 4 > len(raw):
            raise UserError(f"input '{name}': truncated BYTES element length")
        (length,) = struct.unpack_from("<I", raw, pos)
        items.append(bytes(raw[pos + 4:pos + 4 + length]).decode("utf-8", "replace"))
        pos += 4 + length
    if len(items) != count or pos != len(raw):
        raise UserError(f"input '{name}' has {len(items)} BYTES elements; shape {shape} needs {count}")
    return np.array(items, dtype=object).reshape(shape)


def _from_json(name: str, datatype: str, shape: list[int], data: Any) -> np.ndarray:
    try:
        array = np.array(data, dtype=_DATATYPES[datatype])
    except (TypeError, ValueError, OverflowError) as exc:
        raise UserError(f"input '{name}': data is not {datatype}: {exc}") from exc
    count = int(np.prod(shape, dtype=np.int64))
    if array.size != count:
        raise UserError(f"input '{name}' has {array.size} elements; shape {shape} needs {count}")
    return array.reshape(shape)


def encode_response(
    model: str, version: str, results: Mapping[str, Any], request: InferRequest
) -> tuple[bytes, int | None]:
    """The response body and, when it carries binary outputs, the JSON header's length."""
    names = request.outputs if request.outputs is not None else list(results)
    entries: list[dict[str, Any]] = []
    chunks: list[bytes] = []
    for name in names:
        if name not in results:
            raise UserError(f"unknown output '{name}': the model's outputs are {sorted(results)}")
        value = results[name]
        if not isinstance(value, np.ndarray):
            raise UserError(f"output '{name}' is not a tensor ({type(value).__name__}) and cannot be served")
        entry: dict[str, Any] = {
            "name": name,
            "datatype": datatype_of(str(value.dtype) if value.dtype.kind not in "OUS" else "object"),
            "shape": list(value.shape),
        }
        if request.binary_default or name in request.binary_outputs:
            raw = _to_binary(value)
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = _to_json(value)
        entries.append(entry)
    body: dict[str, Any] = {"model_name": model, "model_version": version, "outputs": entries}
    if request.request_id is not None:
        body["id"] = request.request_id
    header = json.dumps(body, separators=(",", ":")).encode()
    if not chunks:
        return header, None
    return b"".join([header, *chunks]), len(header)


def _to_binary(value: np.ndarray) -> bytes:
    if value.dtype.kind in "OUS":
        parts = []
        for item in value.reshape(-1):
            raw = item if isinstance(item, bytes) else str(item).encode()
            parts.append(struct.pack("<I", len(raw)) + raw)
        return b"".join(parts)
    return np.ascontiguousarray(value).tobytes()


def _to_json(value: np.ndarray) -> list[Any]:
    flat = value.reshape(-1)
    if value.dtype.kind in "OUS":
        return [item.decode("utf-8", "replace") if isinstance(item, bytes) else str(item) for item in flat]
    return flat.tolist()
