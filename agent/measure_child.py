"""Candidate measurement in a child process: a runtime that crashes on a model fails its candidate, not the agent.

``measure_in_child`` runs ``agent.measure.measure_candidates`` in a child (``agent.isolation``).
The child says what it is about to do to which candidate (loading, checking outputs, timing,
closing) before it does it, so when it dies, the last thing it said names the candidate that
killed it: that candidate is recorded as failed, with the signal and the runtime's last words
(``crashed (SIGABRT) while closing: free(): invalid pointer``), and the others are measured again
in a fresh child. A crash while the reference device runs the model is the model's failure
(``ModelError``): nothing else could be checked against it.

Child protocol: ``python -m agent.measure_child SPEC_JSON_FILE CANDIDATES_JSON`` sends JSON lines:
``{"on": INDEX, "doing": TEXT}`` (``agent.measure.REFERENCE`` for the reference device),
``{"progress": TEXT}``, then ``{"measured": ...}`` or ``{"error": {"kind": "model"|"internal",
"message": TEXT}}``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from agent.catalog import Candidate
from agent.isolation import ChildChannel, ChildExit, run_child
from agent.measure import REFERENCE, Figure, Measured, Status, measure_candidates
from agent.timing import Budget
from edgecore.errors import ModelError, OperationFailed, one_line

__all__ = ["CHILD_TIMEOUT_S", "Stopped", "measure_in_child"]

CHILD_TIMEOUT_S = 600.0  # for every child of one measurement together


class Stopped(OperationFailed):
    """The measurement was stopped on request (``keep_going`` turned false) before it ended."""


@dataclass(frozen=True)
class _Culprit:
    index: int  # into the candidates the child measured; REFERENCE for the reference device
    doing: str


def measure_in_child(
    model_path: Path,
    candidates: Sequence[Candidate],
    golden: Mapping[str, np.ndarray] | None,
    expected: Mapping[str, np.ndarray] | None,
    precision: str,
    budget: Budget,
    *,
    progress: Callable[[str], None] | None = None,
    keep_going: Callable[[], bool] | None = None,
    timeout_s: float = CHILD_TIMEOUT_S,
    nice: int = 0,
) -> Measured:
    """``measure_candidates`` in a child; a candidate that kills the child is failed and the rest measured again.

    Raises ModelError when the reference device cannot run (or crashes on) the model, and Stopped
    when ``keep_going`` turned false.
    """
    crashed: dict[int, Figure] = {}
    left = list(range(len(candidates)))
    deadline = time.monotonic() + timeout_s
    with tempfile.TemporaryDirectory(prefix="edge-measure-") as tmp:
        spec = _write_spec(Path(tmp), model_path, precision, budget, golden, expected)
        while left:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                for i in left:
                    crashed[i] = _figure(candidates[i], f"not measured: the {timeout_s:g} s for measuring ran out")
                break
            done = run_child("agent.measure_child", [str(spec), json.dumps([candidates[i].to_dict() for i in left])],
                             timeout_s=remaining, keep_going=keep_going, nice=nice,
                             on_message=lambda m: progress(str(m["progress"])) if progress and "progress" in m else None)
            measured = _answer(done, model_path)
            if measured is not None:
                return _merge(candidates, left, crashed, measured)
            culprit = _culprit(done)
            if culprit is None or culprit.index == REFERENCE:
                doing = f" while {culprit.doing}" if culprit else ""
                raise ModelError(f"{model_path.name}: the reference backend {done.how()}{doing}{_tail(done)}")
            index = left.pop(culprit.index)
            reason = f"{done.how()} while {culprit.doing}{_tail(done)}"
            crashed[index] = replace(_figure(candidates[index], reason), signal=done.signal)
            if progress:
                progress(f"{candidates[index].name} {done.how()}: measuring the others in a new process")
    return Measured(tuple(crashed[i] for i in range(len(candidates))))


def _answer(done: ChildExit, model_path: Path) -> Measured | None:
    """The child's measurement, or None when it died first; its errors raised here."""
    if done.stopped:
        raise Stopped(f"{model_path.name}: measuring stopped on request")
    for message in done.messages:
        if "measured" in message:
            return Measured.from_dict(message["measured"])
        if "error" in message:
            error = message["error"]
            kind = ModelError if error.get("kind") == "model" else OperationFailed
            raise kind(str(error.get("message", "the measuring child failed")))
    return None


def _culprit(done: ChildExit) -> _Culprit | None:
    for message in reversed(done.messages):
        if "on" in message:
            return _Culprit(int(message["on"]), str(message.get("doing", "")))
    return None


def _tail(done: ChildExit) -> str:
    return f": {done.stderr_tail}" if done.stderr_tail else ""


def _figure(candidate: Candidate, reason: str) -> Figure:
    return Figure(candidate.name, dict(candidate.options), Status.FAILED, reason)


def _merge(candidates: Sequence[Candidate], left: list[int], crashed: dict[int, Figure], measured: Measured) -> Measured:
    """The child's figures (of the candidates ``left``) and the crashed ones, in the order of ``candidates``."""
    figures = {**crashed, **dict(zip(left, measured.figures, strict=True))}
    winner = left[measured.winner] if measured.winner is not None else None
    return Measured(tuple(figures[i] for i in range(len(candidates))), winner, measured.decision)


def _write_spec(tmp: Path, model_path: Path, precision: str, budget: Budget,
                golden: Mapping[str, np.ndarray] | None, expected: Mapping[str, np.ndarray] | None) -> Path:
    arrays = {"golden": golden, "expected": expected}
    spec: dict[str, Any] = {"model": str(model_path), "precision": precision,
                            "budget": {"seconds": budget.seconds, "rounds": budget.rounds}}
    for key, values in arrays.items():
        spec[key] = None
        if values is not None:
            spec[key] = str(tmp / f"{key}.npz")
            np.savez(spec[key], allow_pickle=False, **_savable(values))
    path = tmp / "spec.json"
    path.write_text(json.dumps(spec))
    return path


def _savable(values: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """Arrays as ``.npz`` keeps them without pickle: text as ``U``; other objects (ONNX-ML maps) left out."""
    kept: dict[str, Any] = {}
    for name, value in values.items():
        array = np.asarray(value)
        if array.dtype == object:
            if not all(isinstance(v, str) for v in array.flat):
                continue
            array = array.astype(str)
        kept[name] = array
    return kept


def _load(path: str | None) -> dict[str, np.ndarray] | None:
    if path is None:
        return None
    with np.load(path, allow_pickle=False) as data:
        return {name: data[name] for name in data.files}


def main(argv: list[str]) -> None:
    channel = ChildChannel()
    spec = json.loads(Path(argv[0]).read_text())
    candidates = [Candidate.from_dict(c) for c in json.loads(argv[1])]
    budget = Budget(float(spec["budget"]["seconds"]), int(spec["budget"]["rounds"]))
    try:
        measured = measure_candidates(
            Path(spec["model"]), candidates, _load(spec["golden"]), _load(spec["expected"]), str(spec["precision"]),
            budget, progress=lambda text: channel.send({"progress": text}),
            watch=lambda index, doing: channel.send({"on": index, "doing": doing}),
        )
        channel.send({"measured": measured.to_dict()})
    except ModelError as exc:
        channel.send({"error": {"kind": "model", "message": str(exc)}})
    except Exception as exc:  # a bug here is reported as one line, the parent raises it
        channel.send({"error": {"kind": "internal", "message": f"{type(exc).__name__}: {one_line(exc)}"}})
    os._exit(0)  # every runner is closed already; skip the runtimes' own teardown at exit


if __name__ == "__main__":
    main(sys.argv[1:])
