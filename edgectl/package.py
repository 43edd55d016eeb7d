"""Building and reading signed model packages (.edgepkg) on the workstation."""

from __future__ import annotations

import io
import os
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agent import __version__
from agent.errors import ModelError, PackageError
from agent.modelcheck import load_model_checked
from agent.protocol.chunks import DEFAULT_CHUNK_SIZE, chunk_digests
from agent.protocol.envelope import MANIFEST_TYPE, Envelope, TrustedKeys, sign
from agent.protocol.manifest import FileEntry, Manifest, PayloadInfo, TargetInfo, TensorSignature
from agent.protocol.package import ENVELOPE_MEMBER, PAYLOAD_MEMBER, open_package, sha256_file

__all__ = ["BuildOptions", "Package", "build_package", "read_package"]

MODEL_FILE = "model.onnx"
GOLDEN_FILE = "golden.npz"


@dataclass(frozen=True)
class BuildOptions:
    name: str
    version: int
    target: TargetInfo = TargetInfo("any")
    chunk_size: int = DEFAULT_CHUNK_SIZE
    valid_days: float = 90.0
    golden_samples: int = 1
    health: dict[str, Any] = field(default_factory=dict)
    reports: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Package:
    """A package on disk with its verified manifest and its payload extracted next to it."""

    path: Path
    envelope: Envelope
    manifest: Manifest
    payload: Path


def build_package(model_path: Path, options: BuildOptions, key: Ed25519PrivateKey, out: Path) -> Manifest:
    """Write a signed .edgepkg for ``model_path`` to ``out`` (atomically) and return its manifest."""
    load_model_checked(model_path)
    with tempfile.TemporaryDirectory(prefix="edgepkg-") as tmp:
        work = Path(tmp)
        inputs, outputs = _write_golden(model_path, work / GOLDEN_FILE, options.golden_samples)
        files = {MODEL_FILE: model_path}
        if options.golden_samples > 0:  # 0: no smoke test (outputs that cannot be recorded, e.g. random)
            files[GOLDEN_FILE] = work / GOLDEN_FILE
        entries = tuple(
            FileEntry(name, path.stat().st_size, sha256_file(path), "model" if name == MODEL_FILE else "golden")
            for name, path in files.items()
        )
        payload = work / PAYLOAD_MEMBER
        _write_tar(payload, files)
        whole, chunks = chunk_digests(payload, options.chunk_size)
        now = time.time()
        manifest = Manifest(
            name=options.name, version=options.version, created_at=now,
            expires_at=now + options.valid_days * 86400, min_agent_version=__version__,
            target=options.target,
            payload=PayloadInfo(payload.stat().st_size, whole, options.chunk_size, tuple(chunks)),
            files=entries, model=MODEL_FILE, inputs=inputs, outputs=outputs,
            golden=GOLDEN_FILE if GOLDEN_FILE in files else None,
            health=options.health, reports=options.reports,
        )
        envelope = sign(MANIFEST_TYPE, manifest.to_bytes(), key)
        (work / ENVELOPE_MEMBER).write_bytes(envelope.to_bytes())
        partial = out.with_name(f".{out.name}.partial")
        _write_tar(partial, {ENVELOPE_MEMBER: work / ENVELOPE_MEMBER, PAYLOAD_MEMBER: payload})
        os.replace(partial, out)
    return manifest


def read_package(path: Path, trusted: TrustedKeys, workdir: Path) -> Package:
    """Open ``path`` as a device would: check the signature, then the payload's size and sha256."""
    envelope, payload = open_package(path, workdir)
    manifest = Manifest.from_bytes(trusted.verify(envelope, MANIFEST_TYPE))
    if payload.stat().st_size != manifest.payload.size or sha256_file(payload) != manifest.payload.sha256:
        raise PackageError(f"{path}: payload does not match the signed manifest")
    return Package(path, envelope, manifest, payload)


def _write_tar(path: Path, files: dict[str, Path]) -> None:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, src in files.items():
            info = tarfile.TarInfo(name)
            info.size = src.stat().st_size
            info.mtime = 0
            info.mode = 0o644
            with src.open("rb") as f:
                tar.addfile(info, f)


def _write_golden(model_path: Path, out: Path, samples: int) -> tuple[tuple[TensorSignature, ...], tuple[TensorSignature, ...]]:
    """Run reproducible inputs through ORT CPU; save them with the outputs as the smoke test."""
    import onnxruntime as ort

    try:
        session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own types for unloadable models
        raise ModelError(f"{model_path}: onnxruntime cannot load the model: {str(exc).splitlines()[0]}") from exc
    rng = np.random.default_rng(20261121)
    sig = lambda items: tuple(TensorSignature(i.name, _np_dtype(i.type), tuple(i.shape)) for i in items)  # noqa: E731
    if samples <= 0:
        return sig(session.get_inputs()), sig(session.get_outputs())
    feeds = {i.name: _sample(i.type, i.shape, samples, rng, i.name) for i in session.get_inputs()}
    results = session.run(None, feeds)
    arrays: dict[str, np.ndarray] = {f"input:{k}": v for k, v in feeds.items()}
    for meta, value in zip(session.get_outputs(), results, strict=False):
        if isinstance(value, np.ndarray) and value.dtype != object:
            arrays[f"output:{meta.name}"] = value
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    out.write_bytes(buf.getvalue())
    return sig(session.get_inputs()), sig(session.get_outputs())


_ORT_TYPES = {
    "tensor(float)": "float32", "tensor(float16)": "float16", "tensor(double)": "float64",
    "tensor(int64)": "int64", "tensor(int32)": "int32", "tensor(int8)": "int8", "tensor(uint8)": "uint8",
    "tensor(bool)": "bool", "tensor(string)": "object",
}


def _np_dtype(ort_type: str) -> str:
    return _ORT_TYPES.get(ort_type, "object")


def _sample(ort_type: str, shape: list[Any], batch: int, rng: np.random.Generator, name: str) -> np.ndarray:
    dtype = _np_dtype(ort_type)
    dims = [d if isinstance(d, int) and d > 0 else (batch if i == 0 else 1) for i, d in enumerate(shape)]
    if dtype == "object":
        raise ModelError(f"input {name!r} takes strings: give golden inputs explicitly (not supported yet)")
    if dtype.startswith("float"):
        return rng.standard_normal(dims).astype(dtype)
    if dtype == "bool":
        return rng.integers(0, 2, dims).astype(bool)
    return rng.integers(0, 10, dims).astype(dtype)
