"""Run an untrusted model once in a child process under memory and time limits.

The child loads the model with onnxruntime on the CPU, reports its I/O signature and, given
inputs, runs them and saves inputs and outputs as golden data. A model that allocates more than
the limit, crashes the runtime or never returns fails that child, never the caller: the caller gets
a :class:`ChildRun` whose ``kind`` says how it ended, and a one-line ``detail`` with the runtime's
whole message.

Child protocol: ``python -m edgecore.sandbox MODEL FEEDS|- OUT|- MEMORY_MB`` prints one JSON line.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgecore.errors import one_line

__all__ = ["ChildRun", "Limits", "run_model"]


@dataclass(frozen=True)
class Limits:
    """How much address space (MiB) and wall time (s) the child gets."""

    memory_mb: int = 8192
    timeout_s: float = 300.0


@dataclass(frozen=True)
class ChildRun:
    """How the child ended: ``ok``, ``load`` (the runtime refused the model), ``run`` (it failed on the
    inputs), ``memory``, ``timeout`` or ``crash``; with the I/O signature as (name, dtype, shape)."""

    kind: str
    detail: str
    inputs: list[tuple[str, str, list[Any]]] = field(default_factory=list)
    outputs: list[tuple[str, str, list[Any]]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.kind == "ok"


def run_model(model: Path, feeds: Mapping[str, np.ndarray] | None, out: Path | None, limits: Limits) -> ChildRun:
    """Load ``model`` (and run ``feeds`` when given, saving golden data to ``out``) in a limited child."""
    with tempfile.TemporaryDirectory(prefix="edge-sandbox-") as tmp:
        feeds_file = "-"
        if feeds is not None:
            feeds_file = str(Path(tmp) / "feeds.npz")
            arrays: dict[str, Any] = {f"input:{k}": v for k, v in feeds.items()}
            np.savez(feeds_file, **arrays)
        argv = [sys.executable, "-m", "edgecore.sandbox", str(model), feeds_file, str(out) if out else "-",
                str(limits.memory_mb)]
        # Few malloc arenas: each reserves 64 MiB of address space per thread, which RLIMIT_AS counts.
        env = {**os.environ, "MALLOC_ARENA_MAX": "2"}
        try:
            proc = subprocess.run(argv, capture_output=True, timeout=limits.timeout_s, text=True, env=env)
        except subprocess.TimeoutExpired:
            return ChildRun("timeout", f"did not finish within {limits.timeout_s:g}s")
    return _result(proc, limits)


def _result(proc: subprocess.CompletedProcess[str], limits: Limits) -> ChildRun:
    if proc.returncode < 0:
        name = signal.Signals(-proc.returncode).name
        return ChildRun("crash", f"the runtime crashed ({name}) within a {limits.memory_mb} MiB memory limit")
    try:
        raw = json.loads(proc.stdout.strip().splitlines()[-1])
        return ChildRun(str(raw["kind"]), str(raw["detail"]), _sigs(raw["inputs"]), _sigs(raw["outputs"]))
    except (ValueError, IndexError, KeyError, TypeError):
        tail = " ".join((proc.stderr or proc.stdout).split())[-500:] or "no output"
        kind = "memory" if _is_memory(tail) else "crash"
        return ChildRun(kind, f"the child exited with {proc.returncode}: {tail}")


def _sigs(items: Any) -> list[tuple[str, str, list[Any]]]:
    return [(str(i[0]), str(i[1]), list(i[2])) for i in items]


def _is_memory(message: str) -> bool:
    lower = message.lower()
    return any(word in lower for word in ("alloc", "memoryerror", "out of memory", "bad_alloc"))


# -- the child ------------------------------------------------------------------------------------

_ORT_TYPES = {
    "tensor(float)": "float32", "tensor(float16)": "float16", "tensor(double)": "float64",
    "tensor(int64)": "int64", "tensor(int32)": "int32", "tensor(int8)": "int8", "tensor(uint8)": "uint8",
    "tensor(bool)": "bool", "tensor(string)": "object",
}


def _child(model: Path, feeds_file: str, out: str) -> dict[str, Any]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own untyped errors
        return {"kind": "memory" if _is_memory(str(exc)) else "load", "detail": one_line(exc), "inputs": [], "outputs": []}
    result: dict[str, Any] = {"kind": "ok", "detail": "loaded", "inputs": _signature(session.get_inputs()),
                              "outputs": _signature(session.get_outputs())}
    if feeds_file == "-":
        return result
    with np.load(feeds_file, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    feeds = {k[len("input:"):]: v for k, v in arrays.items()}
    try:
        values = session.run(None, feeds)
    except Exception as exc:  # whatever the model does to the runtime on these inputs
        return {**result, "kind": "memory" if _is_memory(str(exc)) else "run", "detail": one_line(exc)}
    for meta, value in zip(session.get_outputs(), values, strict=False):
        saved = _savable(value)
        if saved is not None:
            arrays[f"output:{meta.name}"] = saved
    if out != "-":
        np.savez(out, **arrays)
    return {**result, "detail": "ran"}


def _savable(value: Any) -> np.ndarray | None:
    """An output as golden data stores it without pickle: strings as ``U``; None for what cannot be (ONNX-ML maps)."""
    if not isinstance(value, np.ndarray):
        return None
    if value.dtype != object:
        return value
    if not all(isinstance(v, str) for v in value.flat):
        return None
    text = value.astype(str)
    # U pads with NUL and drops trailing NULs: a string ending in NUL cannot be kept exactly, so it is not kept.
    return text if all(a == b for a, b in zip(text.flat, value.flat, strict=True)) else None


def _signature(items: Any) -> list[tuple[str, str, list[Any]]]:
    return [(i.name, _ORT_TYPES.get(i.type, "object"), list(i.shape)) for i in items]


def main(argv: list[str]) -> None:
    import resource

    model, feeds_file, out, memory_mb = Path(argv[0]), argv[1], argv[2], int(argv[3])
    limit = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        result = _child(model, feeds_file, out)
    except MemoryError:
        result = {"kind": "memory", "detail": "MemoryError", "inputs": [], "outputs": []}
    except Exception as exc:  # report anything else as one line rather than a traceback
        result = {"kind": "crash", "detail": f"{type(exc).__name__}: {one_line(exc)}", "inputs": [], "outputs": []}
    print(json.dumps(result, default=str))
    sys.stdout.flush()
    os._exit(0)  # skip the runtime's teardown: it may hang or crash on a hostile model


if __name__ == "__main__":
    main(sys.argv[1:])
