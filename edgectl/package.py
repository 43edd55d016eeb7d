"""Building and reading signed model packages (.edgepkg) on the workstation."""

from __future__ import annotations

import os
import tarfile
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agent import __version__
from agent.backends import TensorSpec
from agent.errors import ModelError, OperationFailed, PackageError, UserError
from agent.feeds import graph_inputs, resolve_shapes, synthetic_feeds
from agent.modelcheck import load_model_checked
from agent.protocol.chunks import DEFAULT_CHUNK_SIZE, chunk_digests
from agent.protocol.envelope import MANIFEST_TYPE, Envelope, TrustedKeys, sign
from agent.protocol.manifest import FileEntry, Manifest, PayloadInfo, TargetInfo, TensorSignature
from agent.protocol.package import ENVELOPE_MEMBER, PAYLOAD_MEMBER, open_package, sha256_file
from agent.sandbox import Limits, run_model

__all__ = ["BuildOptions", "Limits", "Package", "build_package", "read_package"]

MODEL_FILE = "model.onnx"
GOLDEN_FILE = "golden.npz"


@dataclass(frozen=True)
class BuildOptions:
    name: str
    version: int
    target: TargetInfo = field(default_factory=lambda: TargetInfo("any"))
    chunk_size: int = DEFAULT_CHUNK_SIZE
    valid_days: float = 90.0
    golden_samples: int = 1  # 0: no smoke test; with golden_dir, how many samples to stack
    golden_dir: Path | None = None  # real inputs, in the formats `quantize --calib` reads
    input_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    preprocess: Path | None = None  # image preprocessing YAML for golden_dir images
    limits: Limits = field(default_factory=Limits)  # for the child that runs the model to record golden outputs
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
    specs = graph_inputs(load_model_checked(model_path))
    feeds = _golden_feeds(specs, options) if options.golden_samples > 0 else None
    with tempfile.TemporaryDirectory(prefix="edgepkg-") as tmp:
        work = Path(tmp)
        inputs, outputs = _record_golden(model_path, feeds, work / GOLDEN_FILE, options.limits)
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


def read_package(path: Path, trusted: TrustedKeys, workdir: Path, max_bytes: int | None = None) -> Package:
    """Open ``path`` as a device would: check the signature, then copy the payload and check its size and sha256."""
    verified: list[Manifest] = []

    def check(envelope: Envelope) -> int:  # the signature, before any payload byte is written
        verified.append(Manifest.from_bytes(trusted.verify(envelope, MANIFEST_TYPE)))
        size = verified[0].payload.size
        if max_bytes is not None and size > max_bytes:
            raise PackageError(f"{path}: the payload is {size} bytes, over the limit of {max_bytes}")
        return size

    envelope, payload = open_package(path, workdir, check)
    manifest = verified[0]
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


def _golden_feeds(specs: list[TensorSpec], options: BuildOptions) -> dict[str, np.ndarray]:
    """Golden inputs: samples from ``--golden DIR``, else synthesized in the given or fixed shapes."""
    if options.golden_dir is None:
        shapes = resolve_shapes(specs, options.input_shapes, batch=options.golden_samples, alternative="--golden DIR")
        return synthetic_feeds(specs, shapes)
    from quantize.samples import InputSpec, SampleSet  # host-only: the reader behind --calib

    names = {s.name for s in specs}
    unknown = sorted(set(options.input_shapes) - names)
    if unknown:
        raise UserError(f"--input-shape names {', '.join(unknown)}: the model's inputs are {', '.join(sorted(names))}")
    sample_specs = [
        InputSpec(s.name, np.dtype(s.dtype),
                  list(options.input_shapes.get(s.name) or [d if isinstance(d, int) else None for d in s.shape]))
        for s in specs
    ]
    samples = [_as_text(sample) for sample in
               SampleSet.from_dir(options.golden_dir, sample_specs, options.preprocess, limit=options.golden_samples)]
    if len(samples) == 1:
        return samples[0]
    fixed = [s.name for s in specs if s.shape and isinstance(s.shape[0], int)]
    if fixed:
        raise UserError(f"input {fixed[0]!r} has a fixed batch: {len(samples)} golden samples cannot be stacked "
                        "(use --golden-samples 1)")
    try:
        return {s.name: np.concatenate([sample[s.name] for sample in samples]) for s in specs}
    except ValueError as exc:
        raise UserError(f"{options.golden_dir}: the golden samples differ in shape and cannot be stacked ({exc})") from exc


def _as_text(sample: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """String samples as ``U`` arrays: onnxruntime takes them (not ``S``) and golden.npz keeps them without pickle."""
    out = dict(sample)
    for name, array in sample.items():
        if array.dtype.kind == "S":
            try:
                out[name] = np.char.decode(array, "utf-8")
            except UnicodeDecodeError as exc:
                raise UserError(f"golden input {name!r} holds bytes that are not UTF-8 ({exc.reason}): "
                                "the runtime takes strings as UTF-8") from exc
    return out


def _record_golden(model_path: Path, feeds: dict[str, np.ndarray] | None, out: Path,
                   limits: Limits) -> tuple[tuple[TensorSignature, ...], tuple[TensorSignature, ...]]:
    """Run ``feeds`` through ORT CPU in a limited child; save them with the outputs as the smoke test."""
    run = run_model(model_path, feeds, out if feeds is not None else None, limits)
    if run.kind == "load":
        raise ModelError(f"{model_path}: onnxruntime cannot load the model: {run.detail}")
    if run.kind == "memory":
        raise OperationFailed(f"{model_path}: running the model took more than the {limits.memory_mb} MiB memory limit "
                              f"(--memory-mb): {run.detail}")
    if run.kind == "timeout":
        raise OperationFailed(f"{model_path}: the model did not finish within {limits.timeout_s:g}s (--timeout): "
                              "it may loop forever")
    if not run.ok:
        raise OperationFailed(f"{model_path}: the model failed on its golden inputs: {run.detail}")
    return _signature(run.inputs), _signature(run.outputs)


def _signature(items: list[tuple[str, str, list[Any]]]) -> tuple[TensorSignature, ...]:
    return tuple(TensorSignature(name, dtype, tuple(shape)) for name, dtype, shape in items)
