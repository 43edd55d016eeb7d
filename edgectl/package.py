"""Building and reading signed model packages (.edgepkg) on the workstation."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgecore import __version__
from edgecore.backends import TensorSpec
from edgecore.errors import ModelError, OperationFailed, PackageError, UserError, listing
from edgecore.feeds import graph_inputs, resolve_shapes, synthetic_feeds
from edgecore.memory_limit import cgroup_memory
from edgecore.modelcheck import load_model_checked
from edgecore.protocol.chunks import DEFAULT_CHUNK_SIZE, chunk_digests
from edgecore.protocol.envelope import MANIFEST_TYPE, Envelope, TrustedKeys, sign
from edgecore.protocol.manifest import FileEntry, Manifest, PayloadInfo, TargetInfo, TensorSignature
from edgecore.protocol.package import ENVELOPE_MEMBER, PAYLOAD_MEMBER, check_payload, open_package, sha256_file
from edgecore.sandbox import Limits, run_model

__all__ = ["BuildOptions", "Limits", "OrtFormat", "Package", "build_package", "ort_format", "read_package", "seal_package"]

MODEL_FILE = "model.onnx"
GOLDEN_FILE = "golden.npz"
ORT_FILE = "model.ort"  # role "ort": the model for an app on a reduced (ORT-format only) onnxruntime build


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
    ort_dir: Path | None = None  # also write the ORT-format model and its operator config here, and ship the model


@dataclass(frozen=True)
class OrtFormat:
    """What an app embedding a reduced onnxruntime build needs: the model in ORT format and the operators (with
    their types) that build must include (``--include_ops_by_config``, with ``--enable_reduced_operator_type_support``)."""

    model: Path
    operators: Path


def ort_format(model_path: Path, out_dir: Path, name: str) -> OrtFormat:
    """Convert with onnxruntime's own tool (``onnxruntime.tools.convert_onnx_models_to_ort``), in the 'Runtime'
    optimization style that onnxruntime advises for NNAPI and CoreML; write ``NAME.ort`` and
    ``NAME.required_operators_and_types.config`` to ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ort-format-") as tmp:
        source = Path(tmp) / "in" / f"{name}.onnx"
        source.parent.mkdir()
        shutil.copyfile(model_path, source)
        argv = [sys.executable, "-m", "onnxruntime.tools.convert_onnx_models_to_ort", str(source), "--output_dir",
                str(Path(tmp) / "out"), "--optimization_style", "Runtime", "--enable_type_reduction"]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        made = sorted((Path(tmp) / "out").glob("*.ort")), sorted((Path(tmp) / "out").glob("*.config"))
        if proc.returncode != 0 or len(made[0]) != 1 or len(made[1]) != 1:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise ModelError(f"{model_path.name}: onnxruntime cannot convert it to ORT format: {tail[0][:300]}")
        result = OrtFormat(out_dir / f"{name}.ort", out_dir / f"{name}.required_operators_and_types.config")
        shutil.copyfile(made[0][0], result.model)
        shutil.copyfile(made[1][0], result.operators)
    return result


@dataclass(frozen=True)
class Package:
    """A package on disk with its verified manifest and its payload extracted next to it."""

    path: Path
    envelope: Envelope
    manifest: Manifest
    payload: Path


def build_package(model_path: Path, options: BuildOptions, key: Ed25519PrivateKey, out: Path) -> Manifest:
    """Write a signed .edgepkg for ``model_path`` to ``out`` (atomically) and return its manifest."""
    if model_path.suffix.lower() == ".xml":  # the device stages, checks and serves ONNX models only (docs/quantize.md)
        raise UserError(f"{model_path}: an OpenVINO IR cannot be packaged yet (the agent stages and checks ONNX "
                        "models): package the ONNX model instead; MYRIAD and NPU compile float32 ONNX to FP16 themselves")
    specs = graph_inputs(load_model_checked(model_path))
    feeds = _golden_feeds(specs, options) if options.golden_samples > 0 else None
    with tempfile.TemporaryDirectory(prefix="edgepkg-") as tmp:
        work = Path(tmp)
        inputs, outputs = _record_golden(model_path, feeds, work / GOLDEN_FILE, options.limits)
        files = {MODEL_FILE: model_path}
        if options.golden_samples > 0:  # 0: no smoke test (outputs that cannot be recorded, e.g. random)
            files[GOLDEN_FILE] = work / GOLDEN_FILE
        if options.ort_dir is not None:
            files[ORT_FILE] = ort_format(model_path, options.ort_dir, options.name).model
        roles = {MODEL_FILE: "model", GOLDEN_FILE: "golden", ORT_FILE: "ort"}
        now = time.time()
        manifest = Manifest(
            name=options.name, version=options.version, created_at=now,
            expires_at=now + options.valid_days * 86400, min_agent_version=__version__,
            target=options.target, payload=PayloadInfo(0, "", options.chunk_size, ()), files=(),
            model=MODEL_FILE, inputs=inputs, outputs=outputs,
            golden=GOLDEN_FILE if GOLDEN_FILE in files else None,
            health=options.health, reports=options.reports,
        )
        return seal_package({name: (path, roles[name]) for name, path in files.items()}, manifest, key, out, work)


def seal_package(files: Mapping[str, tuple[Path, str]], manifest: Manifest, key: Ed25519PrivateKey, out: Path,
                 work: Path) -> Manifest:
    """Write ``files`` (name -> (path, role)) as the payload of a package signed with ``key`` at ``out`` (atomically).

    ``manifest`` gives everything but the files and the payload, which are filled in here."""
    entries = tuple(FileEntry(name, path.stat().st_size, sha256_file(path), role) for name, (path, role) in files.items())
    payload = work / PAYLOAD_MEMBER
    _write_tar(payload, {name: path for name, (path, _role) in files.items()})
    whole, chunks = chunk_digests(payload, manifest.payload.chunk_size)
    manifest = replace(manifest, files=entries,
                       payload=PayloadInfo(payload.stat().st_size, whole, manifest.payload.chunk_size, tuple(chunks)))
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
    check_payload(payload, manifest, f"{path}: payload")
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
        raise UserError(f"--input-shape names {listing(unknown)}: the model's inputs are {listing(sorted(names))}")
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
                   asked: Limits) -> tuple[tuple[TensorSignature, ...], tuple[TensorSignature, ...]]:
    """Run ``feeds`` through ORT CPU in a limited child; save them with the outputs as the smoke test."""
    limits, source = _limits_here(asked)
    run = run_model(model_path, feeds, out if feeds is not None else None, limits)
    if run.kind == "load":
        raise ModelError(f"{model_path}: onnxruntime cannot load the model: {run.detail}")
    if run.kind == "memory":
        raise OperationFailed(f"{model_path}: running the model took more than the {limits.memory_mb} MiB memory limit "
                              f"({source}): {run.detail}")
    killed = _killed_for_memory(run.kind, run.detail)
    if killed:
        raise OperationFailed(f"{model_path}: {killed}")
    if run.kind == "timeout":
        raise OperationFailed(f"{model_path}: the model did not finish within {limits.timeout_s:g}s (--timeout): "
                              "it may loop forever")
    if not run.ok:
        raise OperationFailed(f"{model_path}: the model failed on its golden inputs: {run.detail}")
    return _signature(run.inputs), _signature(run.outputs)


def _limits_here(asked: Limits) -> tuple[Limits, str]:
    """The child's limits within this process's own, and where the memory figure comes from.

    Under a hard address-space limit below ``--memory-mb`` (``ulimit -v``, a batch system) the child cannot
    be given more than that limit: it gets the limit itself, and the message says whose it is."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY and hard < asked.memory_mb * 2**20:
        return (Limits(hard // 2**20, asked.timeout_s),
                f"this process's hard address-space limit, ulimit -v, is below --memory-mb {asked.memory_mb}")
    return asked, "--memory-mb"


def _killed_for_memory(kind: str, detail: str) -> str | None:
    """Why a child killed with SIGKILL most likely died, when a memory cgroup bounds this process (None otherwise)."""
    if kind != "crash" or "SIGKILL" not in detail:
        return None
    cgroup = cgroup_memory()
    if cgroup is None:
        return None
    return (f"the model was killed (SIGKILL) while it ran, most likely by the kernel's out-of-memory killer: this "
            f"process's memory cgroup ({cgroup.path}) allows {cgroup.limit // 2**20} MiB; build where the model fits")


def _signature(items: list[tuple[str, str, list[Any]]]) -> tuple[TensorSignature, ...]:
    return tuple(TensorSignature(name, dtype, tuple(shape)) for name, dtype, shape in items)
