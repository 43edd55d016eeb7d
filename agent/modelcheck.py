"""Load an ONNX model that may be hostile: check sizes and paths before trusting any of it.

Device-safe: imports only onnx, numpy, the standard library and agent.errors.

``load_model_checked`` refuses, with a one-line :class:`ModelError`:

- a path that is not a regular file, or a file larger than ``max_bytes``;
- bytes that are not an ONNX ModelProto (garbage, truncated protobuf, another message type);
- an IR version or opset newer than the installed onnx package understands;
- nodes in a domain nobody implements (not ONNX, ONNX-ML, ONNX Runtime's, nor a model function);
- initializers with negative dims or more than 2**31 elements;
- external data whose location is absolute, contains ``..``, escapes the model's directory
  (also through a symlink), is a hard link, or whose offset/length are negative or past the
  end of the file. All of this is checked before any external byte is read.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import overload

import onnx
from google.protobuf.message import DecodeError
from onnx import external_data_helper

from agent.errors import ModelError

__all__ = ["DEFAULT_MAX_BYTES", "KNOWN_DOMAINS", "check_model", "load_model_checked"]

DEFAULT_MAX_BYTES = 2 * 1024**3
MAX_TENSOR_ELEMENTS = 2**31

# Domains with real implementations in onnx or onnxruntime; anything else cannot run anywhere.
KNOWN_DOMAINS = frozenset(
    {
        "",
        "ai.onnx",
        "ai.onnx.ml",
        "ai.onnx.training",
        "ai.onnx.preview.training",
        "com.microsoft",
        "com.microsoft.nchwc",
        "com.microsoft.experimental",
        "com.ms.internal.nhwc",
    }
)


def load_model_checked(
    path: Path, *, max_bytes: int = DEFAULT_MAX_BYTES, check_external_data: bool = True
) -> onnx.ModelProto:
    """Read, validate and return the model at ``path`` (external data checked, then loaded).

    With ``check_external_data=False`` external tensors are left as references, unread.
    """
    path = Path(path)
    if not path.is_file():
        raise ModelError(f"{path}: not a file")
    size = path.stat().st_size
    if size > max_bytes:
        raise ModelError(f"{path}: {size} bytes is larger than the limit of {max_bytes} bytes")
    model = _parse(path, path.read_bytes())
    _check_versions(path, model)
    _check_domains(path, model)
    _check_tensor_dims(path, model)
    if check_external_data:
        external = [t for t in _all_tensors(model) if _is_external(t)]
        total = sum(_check_external(path, t) for t in external)
        if size + total > max_bytes:
            raise ModelError(
                f"{path}: model plus external data is {size + total} bytes, over the limit of {max_bytes}"
            )
        if external:
            external_data_helper.load_external_data_for_model(model, str(path.parent))
    return model


def check_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """Run the onnx checker and shape inference; return the model with inferred shapes."""
    try:
        onnx.checker.check_model(model)
        return onnx.shape_inference.infer_shapes(model)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise ModelError(f"model fails the ONNX checker: {_first_line(exc)}") from exc


def _parse(path: Path, data: bytes) -> onnx.ModelProto:
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise ModelError(f"{path}: not an ONNX model (protobuf does not parse: truncated or not ONNX)") from exc
    if model.ir_version <= 0 or not model.HasField("graph"):
        raise ModelError(f"{path}: not an ONNX model (no IR version or graph)")
    return model


def _max_opsets() -> dict[str, int]:
    release = onnx.helper.VERSION_TABLE[-1]
    return {"": onnx.defs.onnx_opset_version(), "ai.onnx": onnx.defs.onnx_opset_version(), "ai.onnx.ml": release[3]}


def _check_versions(path: Path, model: onnx.ModelProto) -> None:
    if model.ir_version > onnx.IR_VERSION:
        raise ModelError(
            f"{path}: IR version {model.ir_version} is newer than this onnx {onnx.__version__} "
            f"supports ({onnx.IR_VERSION})"
        )
    limits = _max_opsets()
    for opset in model.opset_import:
        limit = limits.get(opset.domain)
        if limit is not None and opset.version > limit:
            domain = opset.domain or "ai.onnx"
            raise ModelError(
                f"{path}: opset {domain} {opset.version} is newer than this onnx {onnx.__version__} "
                f"supports ({limit})"
            )


def _check_domains(path: Path, model: onnx.ModelProto) -> None:
    local = {f.domain for f in model.functions}
    for node in _all_nodes(model):
        if node.domain not in KNOWN_DOMAINS and node.domain not in local:
            raise ModelError(f"{path}: node {node.name or node.op_type!r} uses unknown domain {node.domain!r}")


def _check_tensor_dims(path: Path, model: onnx.ModelProto) -> None:
    for tensor in _all_tensors(model):
        elements = 1
        for dim in tensor.dims:
            if dim < 0:
                raise ModelError(f"{path}: tensor {tensor.name!r} has a negative dimension {dim}")
            elements *= dim
        if elements > MAX_TENSOR_ELEMENTS:
            raise ModelError(f"{path}: tensor {tensor.name!r} has {elements} elements (limit {MAX_TENSOR_ELEMENTS})")


def _check_external(path: Path, tensor: onnx.TensorProto) -> int:
    """Validate one external reference without reading it; return its length in bytes."""
    info = {entry.key: entry.value for entry in tensor.external_data}
    where = f"{path}: tensor {tensor.name!r} external data"
    location = info.get("location", "")
    if not location:
        raise ModelError(f"{where} has no location")
    if PurePosixPath(location).is_absolute() or PureWindowsPath(location).is_absolute() or location.startswith("\\"):
        raise ModelError(f"{where} location {location!r} is absolute")
    if ".." in PurePosixPath(location.replace("\\", "/")).parts:
        raise ModelError(f"{where} location {location!r} contains '..'")
    if "\x00" in location:
        raise ModelError(f"{where} location {location!r} contains a NUL byte")
    base = path.parent.resolve()
    try:  # a symlink loop (RuntimeError) or an over-long name (OSError) is the model's fault, not ours
        target = (base / location).resolve()
        if not target.is_relative_to(base):
            raise ModelError(f"{where} location {location!r} resolves outside the model directory")
        if not target.is_file():
            raise ModelError(f"{where} file {location!r} does not exist or is not a file")
        stat = target.stat()
    except (OSError, RuntimeError) as exc:
        raise ModelError(f"{where} location {location[:80]!r} cannot be resolved ({type(exc).__name__})") from exc
    if stat.st_nlink > 1:
        raise ModelError(f"{where} file {location!r} is a hard link (may point outside the model directory)")
    offset, length = _int_field(where, info, "offset", 0), _int_field(where, info, "length", None)
    if length is None:
        length = stat.st_size - offset
    if offset > stat.st_size or offset + length > stat.st_size:
        raise ModelError(
            f"{where} offset {offset} + length {length} is beyond the end of {location!r} ({stat.st_size} bytes)"
        )
    return length


@overload
def _int_field(where: str, info: dict[str, str], key: str, default: int) -> int: ...


@overload
def _int_field(where: str, info: dict[str, str], key: str, default: None) -> int | None: ...


def _int_field(where: str, info: dict[str, str], key: str, default: int | None) -> int | None:
    if key not in info:
        return default
    try:
        value = int(info[key])
    except ValueError as exc:
        raise ModelError(f"{where} {key} {info[key]!r} is not an integer") from exc
    if value < 0:
        raise ModelError(f"{where} {key} {value} is negative")
    return value


def _is_external(tensor: onnx.TensorProto) -> bool:
    return tensor.HasField("data_location") and tensor.data_location == onnx.TensorProto.EXTERNAL


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("g"):
                yield from _graphs(attr.g)
            for sub in attr.graphs:
                yield from _graphs(sub)


def _all_nodes(model: onnx.ModelProto) -> Iterator[onnx.NodeProto]:
    for graph in _graphs(model.graph):
        yield from graph.node
    for function in model.functions:
        yield from function.node


def _all_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    for graph in _graphs(model.graph):
        yield from graph.initializer
        for sparse in graph.sparse_initializer:
            yield sparse.values
        for node in graph.node:
            for attr in node.attribute:
                if attr.HasField("t"):
                    yield attr.t
                yield from attr.tensors


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return next((line.strip() for line in text.splitlines() if line.strip()), type(exc).__name__)
