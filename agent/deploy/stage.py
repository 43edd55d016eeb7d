"""Stage a model in a child process with memory and time limits, so a crash cannot take the agent down.

The child checks the model (hostile-input rules, read without the onnx package: the device has
none), loads it on the backend registry's reference device (onnxruntime's CPU provider), compares
its I/O signature with the signed manifest and, when the package has golden data, runs the golden
inputs and compares with the expected outputs by the model's precision (``edgecore.tensors``). The
resident memory the load and the run added is the model's footprint on that device
(``agent.footprint``), which the device's admission counts.

A pipeline is staged with the models its steps run (``members``: name -> slot directory, the new
versions of its unit or the ones serving): each processing graph is checked and loaded the same
way, the whole pipeline runs its golden inputs (``edgecore.protocol.pipeline.run_steps``) and must
give its golden outputs; its footprint is what its graphs and the run added.

It prints one JSON line: {"ok": bool, "detail": str, "footprint_mb": float | null, "backend": str | null}.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the child imports what it needs only once it runs
    from edgecore.protocol.manifest import Manifest

__all__ = ["StageResult", "stage_in_child"]


@dataclass(frozen=True)
class StageResult:
    ok: bool
    detail: str
    footprint_mb: float | None = None  # resident MiB on ``backend``, when the child got that far
    backend: str | None = None


def stage_in_child(slot_dir: Path, timeout_s: float, memory_mb: int, members: Mapping[str, Path] | None = None) -> StageResult:
    """Run the staging checks on ``slot_dir`` in a child process; a pipeline's with its ``members``' slots."""
    argv = [sys.executable, "-m", "agent.deploy.stage", str(slot_dir), str(memory_mb),
            json.dumps({name: str(path) for name, path in (members or {}).items()})]
    try:
        proc = subprocess.run(argv, capture_output=True, timeout=timeout_s, text=True)
    except subprocess.TimeoutExpired:
        return StageResult(False, f"staging did not finish within {timeout_s:.0f}s")
    if proc.returncode < 0:
        return StageResult(False, f"staging crashed ({signal.Signals(-proc.returncode).name})")
    try:
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        footprint = result.get("footprint_mb")
        return StageResult(bool(result["ok"]), str(result["detail"]),
                           None if footprint is None else float(footprint), result.get("backend"))
    except (ValueError, IndexError, KeyError, TypeError, AttributeError):
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return StageResult(False, f"staging failed (exit {proc.returncode}): {tail[0][:300]}")


def _limit_memory(memory_mb: int) -> None:
    import resource

    limit = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


class _Footprint:
    """The resident MiB added since it was made (the runtime's import already counted before)."""

    def __init__(self) -> None:
        from agent.footprint import rss_mb

        self._rss = rss_mb
        self.before = rss_mb()
        self.mb: float | None = None

    def taken(self) -> None:
        self.mb = round(max(self._rss() - self.before, 0.0), 1)


def _check(slot_dir: Path, members: Mapping[str, Path], found: dict[str, Any]) -> tuple[bool, str]:
    from agent.catalog import reference_candidate
    from edgecore.protocol.manifest import Manifest

    manifest = Manifest.from_bytes((slot_dir / "manifest.json").read_bytes())
    candidate = reference_candidate()
    found["backend"] = candidate.name
    __import__(candidate.backend)  # the runtime's own libraries are not the model's footprint
    if manifest.is_pipeline:
        return _check_pipeline(slot_dir, manifest, members, found)
    return _check_model(slot_dir, manifest, found)


def _check_model(slot_dir: Path, manifest: Manifest, found: dict[str, Any]) -> tuple[bool, str]:
    from agent.catalog import reference_candidate
    from edgecore.errors import EdgeError
    from edgecore.modelcheck import check_model_file
    from edgecore.protocol.golden import load_golden
    from edgecore.tensors import compare_outputs, model_precision, synthetic_feeds

    model_path = slot_dir / manifest.model
    try:
        check_model_file(model_path)
    except EdgeError as exc:
        return False, f"model rejected: {exc}"
    footprint = _Footprint()
    with reference_candidate().open(model_path) as runner:
        got_in = [i.name for i in runner.inputs]
        got_out = [o.name for o in runner.outputs]
        want_in = [t.name for t in manifest.inputs]
        want_out = [t.name for t in manifest.outputs]
        if got_in != want_in or got_out != want_out:
            return False, f"I/O signature {got_in}->{got_out} differs from the manifest's {want_in}->{want_out}"
        if manifest.golden is None:  # the first run happens here all the same, on inputs made from the signature
            runner.infer(synthetic_feeds(runner.inputs))
            footprint.taken()
            found["footprint_mb"] = footprint.mb
            return True, "loaded; I/O signature matches; ran synthesized inputs (no golden data in package)"
        inputs, expected = load_golden(slot_dir / manifest.golden)
        outputs = runner.infer(inputs)
        footprint.taken()
        found["footprint_mb"] = footprint.mb
    problem = compare_outputs(outputs, expected, model_precision(model_path)).problem
    if problem:
        return False, f"golden outputs differ: {problem}"
    return True, f"loaded; I/O signature matches; {len(expected)} golden output(s) match"


def _check_pipeline(slot_dir: Path, manifest: Manifest, members: Mapping[str, Path], found: dict[str, Any]) -> tuple[bool, str]:
    from agent.catalog import reference_candidate
    from edgecore.backends.base import TensorSpec
    from edgecore.errors import EdgeError
    from edgecore.modelcheck import check_model_file
    from edgecore.protocol.golden import load_golden
    from edgecore.protocol.manifest import Manifest
    from edgecore.protocol.pipeline import run_steps
    from edgecore.tensors import compare_outputs, synthetic_feeds

    spec = manifest.pipeline
    assert spec is not None  # a pipeline manifest always has its steps
    missing = [name for name in spec.models if name not in members]
    if missing:
        return False, f"pipeline runs {', '.join(missing)}, which the device does not have"
    runners = {}
    with contextlib.ExitStack() as stack:
        for name in spec.models:
            member = Manifest.from_bytes((members[name] / "manifest.json").read_bytes())
            runners[name] = stack.enter_context(reference_candidate().open(members[name] / member.model))
        footprint = _Footprint()
        for graph in spec.graphs:
            try:
                check_model_file(slot_dir / graph)
            except EdgeError as exc:
                return False, f"graph {graph} rejected: {exc}"
            runners[graph] = stack.enter_context(reference_candidate().open(slot_dir / graph))
        inputs, expected = (load_golden(slot_dir / manifest.golden) if manifest.golden
                            else (synthetic_feeds([TensorSpec(t.name, t.dtype, list(t.shape)) for t in manifest.inputs]), {}))
        names = tuple(t.name for t in manifest.outputs)
        outputs = run_steps(spec, inputs, lambda step, feeds: runners[step.model or step.graph or ""].infer(feeds), names)
        footprint.taken()
        found["footprint_mb"] = footprint.mb
    precision = "fp32"  # the steps run on the reference device, at the members' precision: fp32's tolerance bounds it
    problem = compare_outputs(outputs, expected, precision).problem if expected else None
    if problem:
        return False, f"pipeline golden outputs differ: {problem}"
    what = f"{len(expected)} golden output(s) match" if expected else "ran synthesized inputs (no golden data in package)"
    return True, f"loaded {len(spec.steps)} steps over {', '.join(spec.models)}; {what}"


def main(argv: list[str]) -> int:
    from edgecore.errors import one_line

    slot_dir, memory_mb = Path(argv[0]), int(argv[1])
    members = {name: Path(path) for name, path in json.loads(argv[2]).items()} if len(argv) > 2 else {}
    _limit_memory(memory_mb)
    found: dict[str, Any] = {}
    try:
        ok, detail = _check(slot_dir, members, found)
    except MemoryError:
        ok, detail = False, f"staging exceeded its {memory_mb} MB memory limit"
    except Exception as exc:  # report everything the model can do to the loader as one line
        ok, detail = False, f"{type(exc).__name__}: {one_line(exc)[:1000]}"
    print(json.dumps({"ok": ok, "detail": detail, "footprint_mb": found.get("footprint_mb"),
                      "backend": found.get("backend")}))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
