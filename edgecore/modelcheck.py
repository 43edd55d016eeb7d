"""Check an ONNX model that may be hostile: sizes and paths before trusting any of it.

Two entry points share every check. ``check_model_file`` is the device's: it reads the model
through ``edgecore.modelwire`` (protobuf, no onnx package) against the limits of the installed
onnxruntime, and returns what it read, loading nothing. ``load_model_checked`` is the host's: the
same checks against the installed onnx package's limits, then the model parsed by onnx with its
external data. Both refuse, with a one-line :class:`ModelError`:

- a path that is not a regular file, or a file larger than ``max_bytes``;
- bytes that are not an ONNX ModelProto (garbage, truncated protobuf, another message type);
- an IR version or opset newer than the runtime (onnx on the host, onnxruntime on the device) understands;
- nodes in a domain nobody implements (not ONNX, ONNX-ML, ONNX Runtime's, nor a model function);
- tensors with negative dims or more than 2**31 elements;
- external data whose location is absolute, contains ``..``, escapes the model's directory
  (also through a symlink), is a hard link, or whose offset/length are negative or past the
  end of the file. All of this is checked before any external byte is read.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import TYPE_CHECKING, overload

from edgecore.errors import ModelError
from edgecore.modelwire import ModelView, Tensor, parse_model

if TYPE_CHECKING:
    import onnx

__all__ = [
    "DEFAULT_MAX_BYTES",
    "KNOWN_DOMAINS",
    "VersionLimits",
    "check_model",
    "check_model_file",
    "load_model_checked",
    "onnx_limits",
    "onnxruntime_limits",
]

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

# The IR version each ai.onnx opset shipped with (onnx.helper.VERSION_TABLE): onnxruntime lists its
# operator schemas but not its IR version, so the newest opset it knows says which onnx it embeds.
IR_OF_OPSET = {13: 7, 14: 7, 15: 8, 16: 8, 17: 8, 18: 8, 19: 9, 20: 9, 21: 10, 22: 10, 23: 11, 24: 12, 25: 13, 26: 13,
               27: 13, 28: 14}
# onnxruntime 1.16 (onnx 1.14.1), the oldest any target profile accepts: the limits of a build that does not
# list its operator schemas (such builds exist, e.g. some made from source for Jetson).
ORT_OLDEST_LIMITS = (9, {"": 19, "ai.onnx": 19, "ai.onnx.ml": 3})


@dataclass(frozen=True)
class VersionLimits:
    """The newest IR version and opsets a runtime understands; ``runtime`` names it in errors."""

    runtime: str
    ir_version: int
    opsets: Mapping[str, int]


@functools.cache
def onnx_limits() -> VersionLimits:
    """What the installed onnx package understands (the host's checks)."""
    import onnx

    release = onnx.helper.VERSION_TABLE[-1]
    newest = onnx.defs.onnx_opset_version()
    return VersionLimits(f"onnx {onnx.__version__}", onnx.IR_VERSION, {"": newest, "ai.onnx": newest, "ai.onnx.ml": release[3]})


@functools.cache
def onnxruntime_limits() -> VersionLimits:
    """What the installed onnxruntime understands: the newest opset of its operator schemas per domain."""
    import onnxruntime as ort

    name = f"onnxruntime {ort.__version__}"
    schemas = getattr(ort.capi.onnxruntime_pybind11_state, "get_all_operator_schema", None)
    if schemas is None:
        ir_version, opsets = ORT_OLDEST_LIMITS
        return VersionLimits(f"{name} (its operator schemas are not listed: limits of onnxruntime 1.16)", ir_version, opsets)
    newest: dict[str, int] = {}
    for schema in schemas():
        if schema.domain in ("", "ai.onnx.ml"):
            newest[schema.domain] = max(newest.get(schema.domain, 0), int(schema.since_version))
    opset = newest.get("", ORT_OLDEST_LIMITS[1][""])
    # An opset newer than this table: the newest IR the table knows (refuses too much rather than too little).
    ir_version = IR_OF_OPSET.get(opset, max(IR_OF_OPSET.values()) if opset > max(IR_OF_OPSET) else ORT_OLDEST_LIMITS[0])
    return VersionLimits(name, ir_version, {"": opset, "ai.onnx": opset, "ai.onnx.ml": newest.get("ai.onnx.ml", 3)})


def check_model_file(
    path: Path, *, max_bytes: int = DEFAULT_MAX_BYTES, limits: VersionLimits | None = None, check_external_data: bool = True
) -> ModelView:
    """Run every check on the model at ``path`` without the onnx package; return what was read (nothing is loaded).

    ``limits`` default to the installed onnxruntime's, the runtime that will load the model on a device."""
    path = Path(path)
    if not path.is_file():
        raise ModelError(f"{path}: not a file")
    size = path.stat().st_size
    if size > max_bytes:
        raise ModelError(f"{path}: {size} bytes is larger than the limit of {max_bytes} bytes")
    view = parse_model(path.read_bytes(), str(path))
    _check_versions(path, view, limits or onnxruntime_limits())
    _check_domains(path, view)
    _check_tensor_dims(path, view)
    if check_external_data:
        total = sum(_check_external(path, t) for t in view.tensors if t.external)
        if size + total > max_bytes:
            raise ModelError(
                f"{path}: model plus external data is {size + total} bytes, over the limit of {max_bytes}"
            )
    return view


def load_model_checked(
    path: Path, *, max_bytes: int = DEFAULT_MAX_BYTES, check_external_data: bool = True
) -> onnx.ModelProto:
    """Check, then read and return the model at ``path`` with onnx (external data checked, then loaded).

    With ``check_external_data=False`` external tensors are left as references, unread."""
    import onnx
    from google.protobuf.message import DecodeError
    from onnx import external_data_helper

    path = Path(path)
    view = check_model_file(path, max_bytes=max_bytes, limits=onnx_limits(), check_external_data=check_external_data)
    model = onnx.ModelProto()
    try:
        model.ParseFromString(path.read_bytes())
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise ModelError(f"{path}: not an ONNX model (protobuf does not parse: truncated or not ONNX)") from exc
    if check_external_data and any(t.external for t in view.tensors):
        external_data_helper.load_external_data_for_model(model, str(path.parent))
    return model


def check_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """Run the onnx checker and shape inference; return the model with inferred shapes."""
    import onnx

    try:
        onnx.checker.check_model(model)
        return onnx.shape_inference.infer_shapes(model)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise ModelError(f"model fails the ONNX checker: {_first_line(exc)}") from exc


def _check_versions(path: Path, view: ModelView, limits: VersionLimits) -> None:
    if view.ir_version > limits.ir_version:
        raise ModelError(
            f"{path}: IR version {view.ir_version} is newer than this {limits.runtime} supports ({limits.ir_version})"
        )
    for domain, version in view.opsets:
        limit = limits.opsets.get(domain)
        if limit is not None and version > limit:
            raise ModelError(
                f"{path}: opset {domain or 'ai.onnx'} {version} is newer than this {limits.runtime} supports ({limit})"
            )


def _check_domains(path: Path, view: ModelView) -> None:
    for node in view.nodes:
        if node.domain not in KNOWN_DOMAINS and node.domain not in view.function_domains:
            raise ModelError(f"{path}: node {node.name or node.op_type!r} uses unknown domain {node.domain!r}")


def _check_tensor_dims(path: Path, view: ModelView) -> None:
    for tensor in view.tensors:
        elements = 1
        for dim in tensor.dims:
            if dim < 0:
                raise ModelError(f"{path}: tensor {tensor.name!r} has a negative dimension {dim}")
            elements *= dim
        if elements > MAX_TENSOR_ELEMENTS:
            raise ModelError(f"{path}: tensor {tensor.name!r} has {elements} elements (limit {MAX_TENSOR_ELEMENTS})")


def _check_external(path: Path, tensor: Tensor) -> int:
    """Validate one external reference without reading it; return its length in bytes."""
    info = dict(tensor.external_data)
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


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return next((line.strip() for line in text.splitlines() if line.strip()), type(exc).__name__)
