"""Building a signed pipeline package (like a Triton ensemble): steps over models of the set and ONNX graphs.

A pipeline is described in YAML::

    name: plates              # optional: --name overrides
    models:                   # the packages of the models its steps run (their signatures are checked here)
      detector: det-3.edgepkg
      classifier: cls-2.edgepkg
    outputs: [label_scores]   # the pipeline's outputs; its inputs are the tensors no step makes (or say `inputs:`)
    steps:
      - {name: detect, model: detector, inputs: {images: image}, outputs: {boxes: boxes}}
      - {name: crop, graph: crop.onnx, inputs: {image: image, box: boxes}, outputs: {patch: patch}}
      - {name: classify, model: classifier, inputs: {input: patch}, outputs: {scores: label_scores}}
    golden: inputs.npz        # optional: the pipeline's inputs (default: synthesized from their signatures)

Graphs are ONNX files next to the YAML (pre- and post-processing: no other code runs on the
device). The builder checks the steps as the device will (``edgecore.protocol.pipeline`` and
``edgecore.protocol.intake.check_pipeline_models``), runs the whole pipeline on onnxruntime's CPU,
the device's reference, with ``edgecore.protocol.pipeline.run_steps``, and records its inputs and
outputs as the package's golden data, which the device checks when it stages the pipeline.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgecore import __version__
from edgecore.backends import Runner, TensorSpec, default_registry
from edgecore.errors import EdgeError, ModelError, UserError
from edgecore.modelcheck import load_model_checked
from edgecore.protocol.chunks import DEFAULT_CHUNK_SIZE
from edgecore.protocol.envelope import TrustedKeys
from edgecore.protocol.intake import check_pipeline_models
from edgecore.protocol.manifest import Manifest, PayloadInfo, TargetInfo, TensorSignature
from edgecore.protocol.pipeline import GRAPH_ROLE, PipelineSpec, PipelineStep, run_steps
from edgecore.protocol.schema import Fields
from edgecore.tensors import synthetic_feeds
from edgectl.package import GOLDEN_FILE, Package, read_package, seal_package

__all__ = ["PipelineOptions", "build_pipeline"]


@dataclass(frozen=True)
class PipelineOptions:
    name: str | None  # None: the YAML's
    version: int
    target: TargetInfo = field(default_factory=lambda: TargetInfo("any"))
    chunk_size: int = DEFAULT_CHUNK_SIZE
    valid_days: float = 90.0
    health: dict[str, Any] = field(default_factory=dict)


def build_pipeline(spec_path: Path, options: PipelineOptions, key: Ed25519PrivateKey, trusted: TrustedKeys,
                   out: Path | None = None) -> tuple[Manifest, Path]:
    """Check the pipeline in ``spec_path`` against its models' packages (verified with ``trusted``), run it, and write
    its signed package to ``out`` (default ``NAME-VERSION.edgepkg``); returns its manifest and where it is."""
    raw = _read_yaml(spec_path)
    f = Fields(raw, spec_path.name)
    name = options.name or f.text("name", 64)
    spec = PipelineSpec.read(f)
    packages = f.entries("models", Fields.text)
    base = spec_path.parent
    with tempfile.TemporaryDirectory(prefix="edgepipe-") as tmp:
        work = Path(tmp)
        members = {model: _open(base / path, trusted, work / model) for model, path in packages.items()}
        unknown = sorted(set(spec.models) - set(members))
        if unknown:
            raise UserError(f"{spec_path}: steps run {', '.join(unknown)}, which 'models' does not name")
        with contextlib.ExitStack() as stack:
            runners = _runners(spec, members, base, stack)
            inputs, outputs = _signatures(spec, f, runners)
            now = time.time()
            manifest = Manifest(name=name, version=options.version, created_at=now,
                                expires_at=now + options.valid_days * 86400, min_agent_version=__version__,
                                target=options.target, payload=PayloadInfo(0, "", options.chunk_size, ()), files=(),
                                model="", inputs=inputs, outputs=outputs, golden=GOLDEN_FILE, health=options.health,
                                kind="pipeline", pipeline=spec)
            _check_members(manifest, members)
            feeds = _golden_inputs(base, f, inputs)
            answer = run_steps(spec, feeds, lambda step, given: runners[_key(step)].infer(given),
                               tuple(t.name for t in outputs))
        golden = work / GOLDEN_FILE
        arrays: dict[str, Any] = {**{f"input:{k}": v for k, v in feeds.items()},
                                  **{f"output:{k}": np.asarray(v) for k, v in answer.items()}}
        np.savez(golden, allow_pickle=False, **arrays)
        files = {graph: (base / graph, GRAPH_ROLE) for graph in spec.graphs}
        files[GOLDEN_FILE] = (golden, "golden")
        out = out or Path(f"{name}-{options.version}.edgepkg")
        return seal_package(files, manifest, key, out, work), out


def _read_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise UserError(f"{path} is not valid YAML: {str(exc).splitlines()[0]}") from exc


def _open(path: Path, trusted: TrustedKeys, workdir: Path) -> Package:
    """A model's package, verified as a device verifies it; a pipeline cannot run a pipeline."""
    workdir.mkdir(parents=True)
    package = read_package(path, trusted, workdir)
    if package.manifest.is_pipeline:
        raise UserError(f"{path}: a pipeline's steps run models, and this package is a pipeline")
    return package


def _key(step: PipelineStep) -> str:
    return step.model if step.model is not None else f"graph:{step.graph}"


def _runners(spec: PipelineSpec, members: Mapping[str, Package], base: Path, stack: contextlib.ExitStack) -> dict[str, Runner]:
    """A reference runner (onnxruntime's CPU, as the device stages) per model and per graph the steps run."""
    backend = next(b for b in default_registry() if b.reference is not None)
    device = backend.device(backend.reference or "")
    options = dict(device.options) if device is not None else {}
    runners: dict[str, Runner] = {}
    for step in spec.steps:
        key = _key(step)
        if key in runners:
            continue
        if step.model is not None:
            package = members[step.model]
            path = package.payload.parent / "unpacked" / package.manifest.model
            if not path.exists():
                _unpack(package, path.parent)
        else:
            path = base / (step.graph or "")
            try:
                load_model_checked(path)
            except EdgeError as exc:
                raise ModelError(f"graph {step.graph} of step {step.name!r}: {exc}") from exc
        runner = backend.open(path, backend.reference or "", options)
        runners[key] = stack.enter_context(runner)
    return runners


def _unpack(package: Package, target: Path) -> None:
    from edgecore.protocol.package import extract_payload

    target.mkdir(parents=True, exist_ok=True)
    extract_payload(package.payload, package.manifest, target)


def _signatures(spec: PipelineSpec, f: Fields, runners: Mapping[str, Runner]
                ) -> tuple[tuple[TensorSignature, ...], tuple[TensorSignature, ...]]:
    """The pipeline's inputs (given, else every tensor a step reads that no step makes) and outputs, typed from the
    step that reads or makes each."""
    made = {tensor for step in spec.steps for _, tensor in step.outputs}
    read = [tensor for step in spec.steps for _, tensor in step.inputs]
    given = f.array("inputs", 64) if f.data.get("inputs") is not None else list(dict.fromkeys(t for t in read if t not in made))
    wanted = f.array("outputs", 64)
    if not all(isinstance(n, str) for n in (*given, *wanted)) or not wanted:
        raise UserError(f"{f.what}: 'outputs' (and 'inputs', when given) must be lists of tensor names")
    spec.check_flow(tuple(given), tuple(wanted), f.what)
    specs_in: dict[str, TensorSpec] = {}
    specs_out: dict[str, TensorSpec] = {}
    for step in spec.steps:
        runner = runners[_key(step)]
        ports_in = {s.name: s for s in runner.inputs}
        ports_out = {s.name: s for s in runner.outputs}
        for port, tensor in step.inputs:
            if port not in ports_in:
                raise UserError(f"step {step.name!r}: {port!r} is not an input of its model or graph ({sorted(ports_in)})")
            specs_in.setdefault(tensor, ports_in[port])
        for port, tensor in step.outputs:
            if port not in ports_out:
                raise UserError(f"step {step.name!r}: {port!r} is not an output of its model or graph ({sorted(ports_out)})")
            specs_out[tensor] = ports_out[port]
    missing = [n for n in given if n not in specs_in]
    if missing:
        raise UserError(f"{f.what}: no step reads the input(s) {', '.join(missing)}")
    return tuple(_signature(n, specs_in[n]) for n in given), tuple(_signature(n, specs_out[n]) for n in wanted)


def _signature(name: str, spec: TensorSpec) -> TensorSignature:
    return TensorSignature(name, spec.dtype, tuple(spec.shape))


def _check_members(manifest: Manifest, members: Mapping[str, Package]) -> None:
    try:
        check_pipeline_models(manifest, {name: package.manifest for name, package in members.items()})
    except EdgeError as exc:
        raise UserError(str(exc)) from exc


def _golden_inputs(base: Path, f: Fields, inputs: tuple[TensorSignature, ...]) -> dict[str, np.ndarray]:
    """The pipeline's golden inputs: the YAML's ``golden`` npz, else synthesized (symbolic dimensions as 1)."""
    golden = f.opt_text("golden", 4096)
    if golden is None:
        specs = [TensorSpec(t.name, t.dtype, [d if isinstance(d, int) else 1 for d in t.shape]) for t in inputs]
        return synthetic_feeds(specs)
    with np.load(base / golden, allow_pickle=False) as data:
        feeds = {name: data[name] for name in data.files}
    missing = sorted({t.name for t in inputs} - set(feeds))
    if missing:
        raise UserError(f"{base / golden}: no array for the pipeline input(s) {', '.join(missing)}")
    return {t.name: feeds[t.name] for t in inputs}
