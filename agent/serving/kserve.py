"""KServe v2 / Open Inference Protocol codec: JSON tensors and the binary tensor data extension.

Requests may carry tensors inline (``"data"``) or as raw bytes after the JSON header, whose length
the ``Inference-Header-Content-Length`` HTTP header gives; each binary input says its size in
``parameters.binary_data_size``. Responses use the same layout when the client asks for binary
outputs (``parameters.binary_data_output``, which an output's own ``parameters.binary_data``
overrides either way).

BYTES elements stay ``bytes`` through the codec, so binary tensors are byte-safe. Runtimes take
strings: before a model runs, elements are decoded as UTF-8, and an element that is not UTF-8 is
refused (400) rather than mangled; JSON carries only text, so a non-UTF-8 output element, like a
NaN or an infinity (JSON has neither), is answered 400 with a hint to ask for binary data.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgecore.backends.base import TensorSpec
from edgecore.errors import UserError

__all__ = [
    "MAX_DIM",
    "InferRequest",
    "array_from_raw",
    "array_to_raw",
    "check_input",
    "datatype_of",
    "encode_response",
    "numpy_dtype",
    "parse_request",
    "platform_of",
    "runtime_feeds",
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
MAX_DIM = 2**63 - 1


@dataclass
class InferRequest:
    """A decoded infer request: feeds, which outputs to return and how."""

    feeds: dict[str, np.ndarray]
    outputs: list[str] | None
    binary_choice: dict[str, bool]  # per-output ``binary_data``, where the request says
    binary_default: bool
    request_id: str | None

    def wants_binary(self, name: str) -> bool:
        """Whether output ``name`` goes back as binary data."""
        return self.binary_choice.get(name, self.binary_default)


def datatype_of(dtype: str) -> str:
    """KServe datatype name of a numpy dtype string (``float32`` -> ``FP32``)."""
    return _NUMPY_TO_DATATYPE.get(dtype, "BYTES")


def numpy_dtype(datatype: str) -> np.dtype[Any]:
    """The numpy dtype of a KServe datatype (``BYTES``: object)."""
    return np.dtype(_DATATYPES[datatype])


def platform_of(backend: str) -> str:
    """The protocol's ``<project>_<format>`` platform of a backend (``onnxruntime/CPU...`` -> ``onnxruntime_onnx``)."""
    return f"{backend.split('/', 1)[0]}_onnx"


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
        header = json.loads(header_bytes, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise UserError(f"request JSON is malformed: {exc}") from exc
    if not isinstance(header, dict) or not isinstance(header.get("inputs"), list):
        raise UserError("request must be a JSON object with an 'inputs' list")
    _parameters(header, "'parameters'")
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


def _no_constant(token: str) -> Any:
    raise ValueError(f"{token} is not JSON")


def _parameters(obj: dict[str, Any], field: str) -> dict[str, Any]:
    """``obj["parameters"]`` (absent: empty); anything but an object is a 400 naming the field."""
    value = obj.get("parameters")
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UserError(f"{field} must be an object, got {type(value).__name__}")
    return value


def _request(header: dict[str, Any], feeds: dict[str, np.ndarray]) -> InferRequest:
    params = _parameters(header, "'parameters'")
    requested = header.get("outputs")
    if requested is not None and not isinstance(requested, list):
        raise UserError("'outputs' must be a list of objects with a 'name'")
    outputs = None
    choice: dict[str, bool] = {}
    if requested is not None:
        outputs = []
        for i, out in enumerate(requested):
            if not isinstance(out, dict) or not isinstance(out.get("name"), str):
                raise UserError(f"'outputs[{i}]' must be an object with a string 'name'")
            outputs.append(out["name"])
            binary = _parameters(out, f"'outputs[{i}].parameters'").get("binary_data")
            if binary is not None:
                choice[out["name"]] = bool(binary)
    request_id = header.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise UserError(f"'id' must be a string, got {type(request_id).__name__}")
    return InferRequest(
        feeds=feeds,
        outputs=outputs,
        binary_choice=choice,
        binary_default=bool(params.get("binary_data_output", False)),
        request_id=request_id,
    )


def runtime_feeds(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The feeds as runtimes take them: BYTES elements decoded as UTF-8 (400 naming one that is not)."""
    out = dict(feeds)
    for name, array in feeds.items():
        if array.dtype == object and any(isinstance(v, bytes) for v in array.reshape(-1)[:1]):
            flat = array.reshape(-1)
            texts = np.empty(flat.shape, dtype=object)
            for i, item in enumerate(flat):
                try:
                    texts[i] = item.decode("utf-8") if isinstance(item, bytes) else str(item)
                except UnicodeDecodeError as exc:
                    raise UserError(
                        f"input '{name}' element {i} is not UTF-8 ({exc.reason} at byte {exc.start}): "
                        "the runtime takes strings as UTF-8"
                    ) from exc
            out[name] = texts.reshape(array.shape)
    return out


def _decode_input(
    tensor: Any, specs: Mapping[str, TensorSpec], binary: memoryview, offset: int
) -> tuple[str, np.ndarray, int]:
    """One input tensor as an array, and how many binary bytes it consumed."""
    if not isinstance(tensor, dict) or not isinstance(tensor.get("name"), str):
        raise UserError("each input must be an object with a 'name'")
    name = tensor["name"]
    datatype, shape = check_input(name, tensor.get("datatype"), tensor.get("shape"), specs)
    size = _parameters(tensor, f"'parameters' of input '{name}'").get("binary_data_size")
    if size is not None:
        if not isinstance(size, int) or isinstance(size, bool) or size < 0 or offset + size > len(binary):
            raise UserError(f"input '{name}' declares {size} binary bytes; {len(binary) - offset} remain")
        return name, array_from_raw(name, datatype, shape, binary[offset:offset + size]), size
    if "data" not in tensor:
        raise UserError(f"input '{name}' has neither 'data' nor binary_data_size")
    return name, _from_json(name, datatype, shape, tensor["data"]), 0


def check_input(name: str, datatype: Any, shape: Any, specs: Mapping[str, TensorSpec]) -> tuple[str, list[int]]:
    """An input's datatype and shape, once its name, datatype and shape are checked (UserError naming it)."""
    spec = specs.get(name)
    if spec is None:
        raise UserError(f"unknown input '{name}': the model's inputs are {sorted(specs)}")
    want = datatype_of(spec.dtype)
    if datatype != want:
        raise UserError(f"input '{name}' expects datatype {want}, got {datatype}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise UserError(f"input '{name}' needs a 'shape' list of non-negative integers")
    too_big = next((d for d in shape if d > MAX_DIM), None)
    if too_big is not None:
        raise UserError(f"input '{name}' shape dimension {too_big} exceeds {MAX_DIM} (int64)")
    return want, shape


def array_from_raw(name: str, datatype: str, shape: list[int], raw: memoryview | bytes) -> np.ndarray:
    """Input ``name`` from its raw bytes: little-endian elements, or length-prefixed BYTES elements."""
    count = math.prod(shape)
    if datatype == "BYTES":
        return _bytes_elements(name, shape, count, raw)
    dtype = np.dtype(_DATATYPES[datatype])
    if len(raw) != count * dtype.itemsize:
        raise UserError(
            f"input '{name}' has {len(raw)} bytes; shape {shape} {datatype} needs {count * dtype.itemsize}"
        )
    # Zero-copy view of the request body; read-only is fine for every backend.
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def _bytes_elements(name: str, shape: list[int], count: int, raw: memoryview | bytes) -> np.ndarray:
    items: list[bytes] = []
    pos = 0
    while pos < len(raw) and len(items) <= count:
        if pos + 4 > len(raw):
            raise UserError(f"input '{name}': truncated BYTES element length")
        (length,) = struct.unpack_from("<I", raw, pos)
        if pos + 4 + length > len(raw):
            raise UserError(f"input '{name}': BYTES element {len(items)} declares {length} bytes; {len(raw) - pos - 4} remain")
        items.append(bytes(raw[pos + 4:pos + 4 + length]))
        pos += 4 + length
    if len(items) != count or pos != len(raw):
        raise UserError(f"input '{name}' has {len(items)} BYTES elements; shape {shape} needs {count}")
    return np.array(items, dtype=object).reshape(shape)


def _from_json(name: str, datatype: str, shape: list[int], data: Any) -> np.ndarray:
    if not isinstance(data, list):
        raise UserError(f"input '{name}': 'data' must be a list")
    try:
        array = np.array(data, dtype=_DATATYPES[datatype])
    except (TypeError, ValueError, OverflowError) as exc:
        raise UserError(f"input '{name}': data is not {datatype}: {exc}") from exc
    count = math.prod(shape)
    if array.size != count:
        raise UserError(f"input '{name}' has {array.size} elements; shape {shape} needs {count}")
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        raise UserError(f"input '{name}': data holds null or a value that is not a finite {datatype} number")
    if datatype == "BYTES" and not all(isinstance(v, str) for v in array.reshape(-1)):
        raise UserError(f"input '{name}': BYTES data must be strings")
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
        if request.wants_binary(name):
            raw = array_to_raw(value)
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = _to_json(name, value)
        entries.append(entry)
    body: dict[str, Any] = {"model_name": model, "model_version": version, "outputs": entries}
    if request.request_id is not None:
        body["id"] = request.request_id
    header = json.dumps(body, separators=(",", ":"), allow_nan=False).encode()
    if not chunks:
        return header, None
    return b"".join([header, *chunks]), len(header)


def array_to_raw(value: np.ndarray) -> bytes:
    """An output's raw bytes, as ``array_from_raw`` reads them."""
    if value.dtype.kind in "OUS":
        parts = []
        for item in value.reshape(-1):
            raw = item if isinstance(item, bytes) else str(item).encode("utf-8", "surrogateescape")
            parts.append(struct.pack("<I", len(raw)) + raw)
        return b"".join(parts)
    return np.ascontiguousarray(value).tobytes()


def _to_json(name: str, value: np.ndarray) -> list[Any]:
    flat = value.reshape(-1)
    if value.dtype.kind in "OUS":
        texts = []
        for i, item in enumerate(flat):
            try:
                texts.append(item.decode("utf-8") if isinstance(item, bytes) else str(item))
            except UnicodeDecodeError as exc:
                raise UserError(
                    f"output '{name}' element {i} is not UTF-8, which JSON cannot carry: ask for binary_data"
                ) from exc
        return texts
    if value.dtype.kind in "fc" and not np.isfinite(flat).all():
        raise UserError(f"output '{name}' holds NaN or Infinity, which JSON cannot carry: ask for binary_data")
    return flat.tolist()
