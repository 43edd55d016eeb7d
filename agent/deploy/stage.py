"""Stage a model in a child process with memory and time limits, so a crash cannot take the agent down.

The child checks the model (hostile-input rules), loads it on the backend registry's reference
device (onnxruntime's CPU provider), compares its I/O signature with the signed manifest and, when
the package has golden data, runs the golden inputs and compares with the expected outputs by the
model's precision (``agent.tensors``). It prints one JSON line: {"ok": bool, "detail": str}.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

__all__ = ["StageResult", "stage_in_child"]


class StageResult:
    def __init__(self, ok: bool, detail: str) -> None:
        self.ok = ok
        self.detail = detail


def stage_in_child(slot_dir: Path, timeout_s: float, memory_mb: int) -> StageResult:
    """Run the staging checks on ``slot_dir`` in a child process."""
    argv = [sys.executable, "-m", "agent.deploy.stage", str(slot_dir), str(memory_mb)]
    try:
        proc = subprocess.run(argv, capture_output=True, timeout=timeout_s, text=True)
    except subprocess.TimeoutExpired:
        return StageResult(False, f"staging did not finish within {timeout_s:.0f}s")
    if proc.returncode < 0:
        return StageResult(False, f"staging crashed ({signal.Signals(-proc.returncode).name})")
    try:
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        return StageResult(bool(result["ok"]), str(result["detail"]))
    except (ValueError, IndexError, KeyError, TypeError):
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return StageResult(False, f"staging failed (exit {proc.returncode}): {tail[0][:300]}")


def _limit_memory(memory_mb: int) -> None:
    import resource

    limit = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _check(slot_dir: Path) -> tuple[bool, str]:
    from agent.backends import reference_candidate
    from agent.deploy.golden import load_golden
    from agent.errors import EdgeError
    from agent.modelcheck import load_model_checked
    from agent.protocol.manifest import Manifest
    from agent.tensors import compare_outputs, model_precision, synthetic_feeds

    manifest = Manifest.from_bytes((slot_dir / "manifest.json").read_bytes())
    model_path = slot_dir / manifest.model
    try:
        load_model_checked(model_path)
    except EdgeError as exc:
        return False, f"model rejected: {exc}"
    with reference_candidate().open(model_path) as runner:
        got_in = [i.name for i in runner.inputs]
        got_out = [o.name for o in runner.outputs]
        want_in = [t.name for t in manifest.inputs]
        want_out = [t.name for t in manifest.outputs]
        if got_in != want_in or got_out != want_out:
            return False, f"I/O signature {got_in}->{got_out} differs from the manifest's {want_in}->{want_out}"
        if manifest.golden is None:  # the first run happens here all the same, on inputs made from the signature
            runner.infer(synthetic_feeds(runner.inputs))
            return True, "loaded; I/O signature matches; ran synthesized inputs (no golden data in package)"
        inputs, expected = load_golden(slot_dir / manifest.golden)
        outputs = runner.infer(inputs)
    problem = compare_outputs(outputs, expected, model_precision(model_path)).problem
    if problem:
        return False, f"golden outputs differ: {problem}"
    return True, f"loaded; I/O signature matches; {len(expected)} golden output(s) match"


def main(argv: list[str]) -> int:
    from agent.errors import one_line

    slot_dir, memory_mb = Path(argv[0]), int(argv[1])
    _limit_memory(memory_mb)
    try:
        ok, detail = _check(slot_dir)
    except MemoryError:
        ok, detail = False, f"staging exceeded its {memory_mb} MB memory limit"
    except Exception as exc:  # report everything the model can do to the loader as one line
        ok, detail = False, f"{type(exc).__name__}: {one_line(exc)[:1000]}"
    print(json.dumps({"ok": ok, "detail": detail}))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
