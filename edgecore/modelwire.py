"""An ONNX model as the device reads it: the fields the hostile-model checks need, without the onnx package.

The device has protobuf (onnxruntime depends on it) but not onnx, so this module describes the
subset of ``onnx.proto`` that the checks read (versions, opsets, node domains and op types, tensor
dims and external-data references, graph inputs, subgraphs, functions) in a private descriptor
pool and lets protobuf's own parser read the bytes. Everything else in the file is an unknown
field, skipped as protobuf skips it; a field that appears twice is merged as onnx and onnxruntime
merge it, so no part of a graph can hide from the checks. Strings are read as bytes and decoded
here, so a name that is not UTF-8 is a one-line error, not a crash. Field numbers are onnx.proto's.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from edgecore.errors import ModelError

__all__ = ["ELEMENT_DTYPES", "FLOAT16", "ModelView", "Node", "Tensor", "ValueInput", "parse_model"]

EXTERNAL = 1  # TensorProto.DataLocation.EXTERNAL
FLOAT16 = 10  # TensorProto.DataType.FLOAT16

# TensorProto.DataType -> the numpy dtype name a feed of that type has (what onnx.helper maps it to).
ELEMENT_DTYPES = {
    1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64", 8: "object", 9: "bool",
    10: "float16", 11: "float64", 12: "uint32", 13: "uint64", 14: "complex64", 15: "complex128", 16: "bfloat16",
    17: "float8_e4m3fn", 18: "float8_e4m3fnuz", 19: "float8_e5m2", 20: "float8_e5m2fnuz", 21: "uint4", 22: "int4",
    23: "float4_e2m1fn", 24: "float8_e8m0fnu", 25: "uint2", 26: "int2",
}

_OPTIONAL, _REPEATED = 1, 3
_INT64, _INT32, _BYTES, _MESSAGE = 3, 5, 12, 11

# message -> (field name, number, label, type, message type); only what the checks read.
_SCHEMA: dict[str, list[tuple[str, int, int, int, str]]] = {
    "Model": [("ir_version", 1, _OPTIONAL, _INT64, ""), ("opset_import", 8, _REPEATED, _MESSAGE, "OpsetId"),
              ("graph", 7, _OPTIONAL, _MESSAGE, "Graph"), ("functions", 25, _REPEATED, _MESSAGE, "Function")],
    "OpsetId": [("domain", 1, _OPTIONAL, _BYTES, ""), ("version", 2, _OPTIONAL, _INT64, "")],
    "Graph": [("node", 1, _REPEATED, _MESSAGE, "Node"), ("initializer", 5, _REPEATED, _MESSAGE, "Tensor"),
              ("sparse_initializer", 15, _REPEATED, _MESSAGE, "Sparse"), ("input", 11, _REPEATED, _MESSAGE, "ValueInfo")],
    "Node": [("name", 3, _OPTIONAL, _BYTES, ""), ("op_type", 4, _OPTIONAL, _BYTES, ""), ("domain", 7, _OPTIONAL, _BYTES, ""),
             ("attribute", 5, _REPEATED, _MESSAGE, "Attribute")],
    "Attribute": [("t", 5, _OPTIONAL, _MESSAGE, "Tensor"), ("g", 6, _OPTIONAL, _MESSAGE, "Graph"),
                  ("tensors", 10, _REPEATED, _MESSAGE, "Tensor"), ("graphs", 11, _REPEATED, _MESSAGE, "Graph"),
                  ("sparse_tensor", 22, _OPTIONAL, _MESSAGE, "Sparse"), ("sparse_tensors", 23, _REPEATED, _MESSAGE, "Sparse")],
    "Tensor": [("dims", 1, _REPEATED, _INT64, ""), ("data_type", 2, _OPTIONAL, _INT32, ""), ("name", 8, _OPTIONAL, _BYTES, ""),
               ("external_data", 13, _REPEATED, _MESSAGE, "Entry"), ("data_location", 14, _OPTIONAL, _INT32, "")],
    "Entry": [("key", 1, _OPTIONAL, _BYTES, ""), ("value", 2, _OPTIONAL, _BYTES, "")],
    "Sparse": [("values", 1, _OPTIONAL, _MESSAGE, "Tensor")],
    "Function": [("node", 7, _REPEATED, _MESSAGE, "Node"), ("domain", 10, _OPTIONAL, _BYTES, "")],
    "ValueInfo": [("name", 1, _OPTIONAL, _BYTES, ""), ("type", 2, _OPTIONAL, _MESSAGE, "Type")],
    "Type": [("tensor_type", 1, _OPTIONAL, _MESSAGE, "TypeTensor")],
    "TypeTensor": [("elem_type", 1, _OPTIONAL, _INT32, ""), ("shape", 2, _OPTIONAL, _MESSAGE, "Shape")],
    "Shape": [("dim", 1, _REPEATED, _MESSAGE, "Dim")],
    "Dim": [("dim_value", 1, _OPTIONAL, _INT64, ""), ("dim_param", 2, _OPTIONAL, _BYTES, "")],
}
_PACKAGE = "edgecore_modelwire"  # not "onnx": the host may load onnx's own descriptors in the same process


@dataclass(frozen=True)
class Tensor:
    """A tensor's identity and where its bytes live; the bytes themselves are never kept."""

    name: str
    dims: tuple[int, ...]
    data_type: int
    external: bool
    external_data: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Node:
    name: str
    op_type: str
    domain: str


@dataclass(frozen=True)
class ValueInput:
    """A graph input: element type (0 when not a tensor) and dims (an int, a symbolic name, or None)."""

    name: str
    elem_type: int
    dims: tuple[int | str | None, ...]
    is_tensor: bool


@dataclass(frozen=True)
class ModelView:
    """What the checks read from one model: versions, every node and tensor (subgraphs and functions included)."""

    ir_version: int
    opsets: tuple[tuple[str, int], ...]
    nodes: tuple[Node, ...]  # the main graph's, subgraphs', then functions'
    top_nodes: tuple[Node, ...]  # the main graph's only
    tensors: tuple[Tensor, ...]
    initializers: tuple[Tensor, ...]  # the main graph's initializers only
    inputs: tuple[ValueInput, ...]
    function_domains: frozenset[str]


def parse_model(data: bytes, where: str) -> ModelView:
    """The model in ``data``; ModelError naming ``where`` when the bytes are not an ONNX ModelProto."""
    from google.protobuf.message import DecodeError

    message = _classes()["Model"]()
    try:
        message.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise ModelError(f"{where}: not an ONNX model (protobuf does not parse: truncated or not ONNX)") from exc
    if message.ir_version <= 0 or not message.HasField("graph"):
        raise ModelError(f"{where}: not an ONNX model (no IR version or graph)")
    text = functools.partial(_text, where)
    graphs = list(_graphs(message.graph))
    nodes = [n for g in graphs for n in g.node] + [n for f in message.functions for n in f.node]
    return ModelView(
        ir_version=int(message.ir_version),
        opsets=tuple((text(o.domain), int(o.version)) for o in message.opset_import),
        nodes=tuple(_node(n, text) for n in nodes),
        top_nodes=tuple(_node(n, text) for n in message.graph.node),
        tensors=tuple(_tensor(t, text) for g in graphs for t in _graph_tensors(g)),
        initializers=tuple(_tensor(t, text) for t in message.graph.initializer),
        inputs=tuple(_input(v, text) for v in message.graph.input),
        function_domains=frozenset(text(f.domain) for f in message.functions),
    )


@functools.cache
def _classes() -> dict[str, Any]:
    """Message classes for ``_SCHEMA``, built once in a private descriptor pool."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    file = descriptor_pb2.FileDescriptorProto(name=f"{_PACKAGE}.proto", package=_PACKAGE, syntax="proto2")
    for message_name, fields in _SCHEMA.items():
        message = file.message_type.add(name=message_name)
        for name, number, label, kind, type_name in fields:
            field = message.field.add(name=name, number=number, label=label, type=kind)
            if type_name:
                field.type_name = f".{_PACKAGE}.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    # GetMessageClass arrived in protobuf 4.22; older releases (still on some Jetson images) build through a factory.
    make = getattr(message_factory, "GetMessageClass", None) or message_factory.MessageFactory(pool).GetPrototype
    return {name: make(pool.FindMessageTypeByName(f"{_PACKAGE}.{name}")) for name in _SCHEMA}


def _text(where: str, raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ModelError(f"{where}: not an ONNX model (a name is not UTF-8: {raw[:40]!r})") from None


def _graphs(graph: Any) -> Iterator[Any]:
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("g"):
                yield from _graphs(attr.g)
            for sub in attr.graphs:
                yield from _graphs(sub)


def _graph_tensors(graph: Any) -> Iterator[Any]:
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("sparse_tensor"):
                yield attr.sparse_tensor.values
            for sparse in attr.sparse_tensors:
                yield sparse.values


def _node(node: Any, text: Any) -> Node:
    return Node(text(node.name), text(node.op_type), text(node.domain))


def _tensor(tensor: Any, text: Any) -> Tensor:
    return Tensor(
        name=text(tensor.name),
        dims=tuple(int(d) for d in tensor.dims),
        data_type=int(tensor.data_type),
        external=tensor.HasField("data_location") and tensor.data_location == EXTERNAL,
        external_data=tuple((text(e.key), text(e.value)) for e in tensor.external_data),
    )


def _input(value: Any, text: Any) -> ValueInput:
    is_tensor = value.type.HasField("tensor_type")
    tensor = value.type.tensor_type
    dims: list[int | str | None] = [
        int(d.dim_value) if d.HasField("dim_value") and d.dim_value > 0 else (text(d.dim_param) or None)
        for d in tensor.shape.dim
    ]
    return ValueInput(text(value.name), int(tensor.elem_type), tuple(dims), is_tensor)
