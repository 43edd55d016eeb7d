"""The package manifest: what a package holds, signed by the fleet owner, checked by the device."""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from edgecore.errors import ProtocolError, VerificationError
from edgecore.protocol.pipeline import GRAPH_ROLE, PipelineSpec
from edgecore.protocol.schema import SCHEMA_VERSION, Fields

__all__ = ["KINDS", "FileEntry", "Manifest", "PayloadInfo", "TargetInfo", "TensorSignature", "manifest_sha256"]

KINDS = ("model", "pipeline")  # what a package holds: one model, or a pipeline over models of the set

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
MAX_FILES = 256
MAX_PAYLOAD_BYTES = 8 * 1024**3


def manifest_sha256(manifest_bytes: bytes) -> str:
    """The identity of a signed manifest: sha256 over its exact bytes (two builds of one payload differ)."""
    return hashlib.sha256(manifest_bytes).hexdigest()


def _sha(value: str, what: str) -> str:
    if not _SHA256.match(value):
        raise ProtocolError(f"{what}: not a lowercase hex sha256")
    return value


def _safe_relpath(value: str, what: str) -> str:
    parts = value.split("/")
    if value.startswith("/") or "\\" in value or any(p in ("", ".", "..") for p in parts):
        raise ProtocolError(f"{what}: unsafe path {value!r}")
    return value


@dataclass(frozen=True)
class FileEntry:
    path: str
    size: int
    sha256: str
    role: str  # model | golden | partition | report


@dataclass(frozen=True)
class PayloadInfo:
    """The payload blob that travels in chunks: its size, hash, chunk size and per-chunk hashes."""

    size: int
    sha256: str
    chunk_size: int
    chunks: tuple[str, ...]


@dataclass(frozen=True)
class TensorSignature:
    name: str
    dtype: str
    shape: tuple[Any, ...]


@dataclass(frozen=True)
class TargetInfo:
    """The target profile the package was built for."""

    name: str
    execution_providers: tuple[str, ...] = ()
    device_classes: tuple[str, ...] = ()

    def accepts(self, device_target: str | None) -> bool:
        """A package for target 'any' runs anywhere; otherwise the device's target must be listed."""
        if self.name == "any":
            return True
        return device_target is not None and device_target in (self.name, *self.device_classes)


@dataclass(frozen=True)
class Manifest:
    """A package's signed description. ``kind`` "pipeline": ``model`` is empty and ``pipeline`` holds the steps."""

    name: str
    version: int
    created_at: float
    expires_at: float
    min_agent_version: str
    target: TargetInfo
    payload: PayloadInfo
    files: tuple[FileEntry, ...]
    model: str
    inputs: tuple[TensorSignature, ...]
    outputs: tuple[TensorSignature, ...]
    golden: str | None = None
    health: dict[str, Any] = field(default_factory=dict)
    reports: dict[str, Any] = field(default_factory=dict)
    kind: str = "model"
    pipeline: PipelineSpec | None = None

    @property
    def is_pipeline(self) -> bool:
        return self.kind == "pipeline"

    @property
    def artifact_id(self) -> str:
        """The artifact id on the wire is the payload's sha256."""
        return self.payload.sha256

    def file(self, path: str) -> FileEntry:
        for entry in self.files:
            if entry.path == path:
                return entry
        raise ProtocolError(f"manifest: no file {path!r}")

    def check_fresh(self, now: float | None = None) -> None:
        if (now or time.time()) > self.expires_at:
            raise VerificationError(f"manifest of {self.name} v{self.version} expired at {time.ctime(self.expires_at)}")

    def to_bytes(self) -> bytes:
        data = asdict(self)
        # A model's manifest leaves both out, so it reads the same as before pipelines existed.
        data.pop("kind"), data.pop("pipeline")
        if self.pipeline is not None:
            data.update(kind=self.kind, pipeline=self.pipeline.to_json())
        data["target"] = {k: list(v) for k, v in data["target"].items() if k != "name"} | {"name": self.target.name}
        data["payload"]["chunks"] = list(self.payload.chunks)
        for key in ("inputs", "outputs"):
            data[key] = [dict(t, shape=list(t["shape"])) for t in data[key]]
        data["files"] = list(data["files"])
        return json.dumps({"schema": SCHEMA_VERSION, **data}, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> Manifest:
        from edgecore.protocol.schema import decode_json

        f = decode_json(raw, "manifest", max_bytes=4 * 1024 * 1024)
        payload = f.obj("payload")
        chunk_size = payload.integer("chunk_size", 1024, 64 * 1024 * 1024)
        size = payload.integer("size", 1, MAX_PAYLOAD_BYTES)
        chunks = tuple(_sha(c, "manifest.payload.chunks") for c in payload.array("chunks") if isinstance(c, str))
        if len(chunks) != -(-size // chunk_size):
            raise ProtocolError(f"manifest.payload: {len(chunks)} chunk hashes for {size} bytes in chunks of {chunk_size}")
        files = tuple(_file(Fields(e, "manifest.files[]")) for e in f.array("files", MAX_FILES))
        paths = {e.path for e in files}
        kind = f.opt_text("kind", 16) or "model"
        if kind not in KINDS:
            raise ProtocolError(f"manifest.kind: {kind!r} is not one of {', '.join(KINDS)}")
        model = _safe_relpath(f.text("model"), "manifest.model") if kind == "model" else ""
        golden = f.opt_text("golden")
        for ref in filter(None, (model, golden)):
            if ref not in paths:
                raise ProtocolError(f"manifest: {ref!r} is not among the listed files")
        inputs = tuple(_tensor(Fields(t, "manifest.inputs[]")) for t in f.array("inputs", 256))
        outputs = tuple(_tensor(Fields(t, "manifest.outputs[]")) for t in f.array("outputs", 256))
        pipeline = _pipeline(f, kind, files, inputs, outputs)
        target = f.obj("target")
        return cls(
            name=f.text("name", 128),
            version=f.integer("version", 1),
            created_at=f.number("created_at"),
            expires_at=f.number("expires_at"),
            min_agent_version=f.text("min_agent_version", 32),
            target=TargetInfo(
                name=target.text("name", 64),
                execution_providers=tuple(map(str, target.array("execution_providers", 32))),
                device_classes=tuple(map(str, target.array("device_classes", 64))),
            ),
            payload=PayloadInfo(size, _sha(payload.text("sha256"), "manifest.payload.sha256"), chunk_size, chunks),
            files=files,
            model=model,
            inputs=inputs,
            outputs=outputs,
            golden=golden,
            health=f.raw_obj("health") if "health" in f.data else {},
            reports=f.raw_obj("reports") if "reports" in f.data else {},
            kind=kind,
            pipeline=pipeline,
        )


def _pipeline(f: Fields, kind: str, files: tuple[FileEntry, ...], inputs: tuple[TensorSignature, ...],
              outputs: tuple[TensorSignature, ...]) -> PipelineSpec | None:
    """A pipeline manifest's steps, checked against its files and its inputs and outputs; None for a model."""
    if kind != "pipeline":
        if f.data.get("pipeline") is not None:
            raise ProtocolError("manifest.pipeline: only a manifest of kind 'pipeline' has steps")
        return None
    if f.data.get("model"):
        raise ProtocolError("manifest.model: a pipeline names its models in its steps, not in 'model'")
    spec = PipelineSpec.read(f.obj("pipeline"))
    graphs = {e.path for e in files if e.role == GRAPH_ROLE}
    for graph in spec.graphs:
        _safe_relpath(graph, "manifest.pipeline.steps[].graph")
        if graph not in graphs:
            raise ProtocolError(f"manifest.pipeline: graph {graph!r} is not among the files of role {GRAPH_ROLE!r}")
    if not inputs or not outputs:
        raise ProtocolError("manifest: a pipeline needs its inputs and outputs")
    spec.check_flow(tuple(t.name for t in inputs), tuple(t.name for t in outputs), "manifest.pipeline")
    return spec


def _file(f: Fields) -> FileEntry:
    return FileEntry(
        path=_safe_relpath(f.text("path", 256), "manifest.files[].path"),
        size=f.integer("size", 0, MAX_PAYLOAD_BYTES),
        sha256=_sha(f.text("sha256"), "manifest.files[].sha256"),
        role=f.text("role", 32),
    )


def _tensor(f: Fields) -> TensorSignature:
    shape = f.array("shape", 16)
    if not all(isinstance(d, (int, str)) or d is None for d in shape):
        raise ProtocolError(f"{f.what}.shape: dimensions must be integers, names or null")
    return TensorSignature(f.text("name", 256), f.text("dtype", 32), tuple(shape))
