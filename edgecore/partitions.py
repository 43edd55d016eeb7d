"""Run a partitioned model (``edgectl partition`` output) piece by piece with onnxruntime.

Device-safe: imports onnxruntime, numpy, the standard library and agent modules only.
The manifest (``partitions.json``) lists pieces in execution order; each piece names its
provider, its boundary inputs and outputs, and the sha256 of its file. Tensors flow between
pieces by name.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from edgecore.errors import ModelError, listing
from edgecore.modelcheck import check_model_file
from edgecore.protocol.package import sha256_file

__all__ = ["MANIFEST_FORMAT", "MANIFEST_NAME", "PartitionPlan", "PartitionedRunner", "Piece", "load_plan"]

MANIFEST_NAME = "partitions.json"
MANIFEST_FORMAT = "edgectl.partitions/1"


@dataclass(frozen=True)
class Piece:
    """One sub-model and the provider it was cut for."""

    file: Path
    provider: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


@dataclass(frozen=True)
class PartitionPlan:
    """The pieces in order plus the original model's inputs and outputs."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    pieces: tuple[Piece, ...]


def load_plan(directory: Path) -> PartitionPlan:
    """Read and validate ``directory/partitions.json`` (files inside the directory, hashes match)."""
    path = directory / MANIFEST_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelError(f"{path}: cannot read partition manifest: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
        raise ModelError(f"{path}: key 'format': expected {MANIFEST_FORMAT!r}")
    try:
        pieces = tuple(_piece(directory, entry) for entry in data["pieces"])
        return PartitionPlan(tuple(data["inputs"]), tuple(data["outputs"]), pieces)
    except (KeyError, TypeError) as exc:
        raise ModelError(f"{path}: malformed manifest: missing or wrong key {exc}") from exc


def _piece(directory: Path, entry: Mapping[str, Any]) -> Piece:
    name = str(entry["file"])
    file = (directory / name).resolve()
    if Path(name).name != name or not file.is_relative_to(directory.resolve()):
        raise ModelError(f"{directory / MANIFEST_NAME}: piece file {name!r} is not a plain name in the directory")
    if not file.is_file() or sha256_file(file) != entry["sha256"]:
        raise ModelError(f"{file}: missing or its sha256 does not match the manifest")
    return Piece(file, str(entry["provider"]), tuple(entry["inputs"]), tuple(entry["outputs"]))


class PartitionedRunner:
    """Sessions for every piece; ``run`` feeds boundary tensors from one piece to the next.

    A piece whose provider is not available here runs on the CPU; ``fallbacks`` lists those,
    so callers never report an accelerator they are not using.
    """

    def __init__(self, plan: PartitionPlan, available: Sequence[str] | None = None) -> None:
        import onnxruntime as ort

        have = set(ort.get_available_providers() if available is None else available)
        self.plan = plan
        self.fallbacks: list[str] = []
        self._sessions = []
        for piece in plan.pieces:
            providers = list(dict.fromkeys([piece.provider, "CPUExecutionProvider"]))
            providers = providers if piece.provider in have else ["CPUExecutionProvider"]
            if piece.provider not in have:
                self.fallbacks.append(f"{piece.file.name}: {piece.provider} unavailable, using CPUExecutionProvider")
            check_model_file(piece.file)
            try:
                self._sessions.append(ort.InferenceSession(str(piece.file), providers=providers))
            except Exception as exc:  # onnxruntime's own exception types
                raise ModelError(f"{piece.file.name}: onnxruntime cannot load it: {str(exc).splitlines()[0]}") from exc

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run all pieces in order; return the original model's outputs by name."""
        missing = [name for name in self.plan.inputs if name not in feeds]
        if missing:
            raise ModelError(f"missing input {missing[0]!r}; the model needs {listing(self.plan.inputs)}")
        values: dict[str, np.ndarray] = dict(feeds)
        for piece, session in zip(self.plan.pieces, self._sessions, strict=False):
            results = session.run(list(piece.outputs), {name: values[name] for name in piece.inputs})
            values.update(zip(piece.outputs, results, strict=False))
        return {name: values[name] for name in self.plan.outputs}

    def close(self) -> None:
        """Drop the sessions."""
        self._sessions.clear()

    def __enter__(self) -> PartitionedRunner:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
