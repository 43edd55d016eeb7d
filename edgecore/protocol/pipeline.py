"""A pipeline (like a Triton ensemble): steps over models of the device's set and ONNX processing graphs.

A pipeline package's signed manifest (``"kind": "pipeline"``) carries a :class:`PipelineSpec`.
Each step runs either a model of the desired set (``model``: its name) or a pre/post-processing
ONNX graph shipped in the pipeline's own payload (``graph``: a file of role ``graph``); no other
code runs. The step's ``inputs`` map each of its input names to a pipeline tensor, its ``outputs``
map each of its output names to a new pipeline tensor. The pipeline's own inputs (the manifest's
``inputs``) are the first tensors; its outputs (the manifest's ``outputs``) are tensors some step
makes. Steps run in the order given, so a step reads only what came before it: no cycles.

:func:`run_steps` is what a pipeline means: the host builds a pipeline's golden outputs with it,
and the device serves the pipeline with it, so both give the same answer for the same steps.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from edgecore.errors import ProtocolError
from edgecore.protocol.schema import Fields
from edgecore.protocol.topics import validate_id

__all__ = ["GRAPH_ROLE", "MAX_STEPS", "PipelineSpec", "PipelineStep", "run_steps"]

GRAPH_ROLE = "graph"  # the role of a processing graph among a pipeline package's files
MAX_STEPS = 32


@dataclass(frozen=True)
class PipelineStep:
    """One step: a model of the set (``model``) or a processing graph of the payload (``graph``), with its mapping."""

    name: str
    model: str | None
    graph: str | None
    inputs: tuple[tuple[str, str], ...]  # (the step's input name, the pipeline tensor fed to it)
    outputs: tuple[tuple[str, str], ...]  # (the step's output name, the pipeline tensor it becomes)

    def __post_init__(self) -> None:
        # Kept sorted: a mapping's order means nothing, and the signed manifest is written with sorted keys.
        object.__setattr__(self, "inputs", tuple(sorted(self.inputs)))
        object.__setattr__(self, "outputs", tuple(sorted(self.outputs)))

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"name": self.name}
        data.update({"model": self.model} if self.model is not None else {"graph": self.graph})
        data.update(inputs=dict(self.inputs), outputs=dict(self.outputs))
        return data

    @classmethod
    def read(cls, f: Fields) -> PipelineStep:
        name = validate_id(f.text("name", 64), f"{f.what}.name")
        model, graph = f.opt_text("model", 64), f.opt_text("graph", 256)
        if (model is None) == (graph is None):
            raise ProtocolError(f"{f.what} {name!r}: give exactly one of 'model' (a model of the set) or 'graph'")
        if model is not None:
            validate_id(model, f"{f.what}.model")
        inputs, outputs = f.entries("inputs", Fields.text), f.entries("outputs", Fields.text)
        if not inputs or not outputs:
            raise ProtocolError(f"{f.what} {name!r}: 'inputs' and 'outputs' must each map at least one tensor")
        return cls(name, model, graph, tuple(inputs.items()), tuple(outputs.items()))


@dataclass(frozen=True)
class PipelineSpec:
    """The steps of a pipeline, in the order they run."""

    steps: tuple[PipelineStep, ...]

    @property
    def models(self) -> tuple[str, ...]:
        """The names of the set's models the pipeline runs, each once, in step order."""
        return tuple(dict.fromkeys(s.model for s in self.steps if s.model is not None))

    @property
    def graphs(self) -> tuple[str, ...]:
        return tuple(s.graph for s in self.steps if s.graph is not None)

    def to_json(self) -> dict[str, Any]:
        return {"steps": [s.to_json() for s in self.steps]}

    @classmethod
    def read(cls, f: Fields) -> PipelineSpec:
        raw = f.array("steps", MAX_STEPS)
        if not raw:
            raise ProtocolError(f"{f.what}.steps: a pipeline needs at least one step")
        steps = tuple(PipelineStep.read(Fields(s, f"{f.what}.steps[{i}]")) for i, s in enumerate(raw))
        names = [s.name for s in steps]
        if len(set(names)) != len(names):
            raise ProtocolError(f"{f.what}.steps: step names must be unique ({', '.join(names)})")
        return cls(steps)

    def check_flow(self, inputs: tuple[str, ...], outputs: tuple[str, ...], what: str = "pipeline") -> None:
        """Every step reads tensors made before it, none is made twice, and every pipeline output is made."""
        known = set(inputs)
        for step in self.steps:
            for port, tensor in step.inputs:
                if tensor not in known:
                    raise ProtocolError(f"{what}: step {step.name!r} input {port!r} reads {tensor!r}, which no earlier "
                                        "step makes and the pipeline's inputs do not name")
            for port, tensor in step.outputs:
                if tensor in known:
                    raise ProtocolError(f"{what}: step {step.name!r} output {port!r} makes {tensor!r} again")
                known.add(tensor)
        missing = [name for name in outputs if name not in known]
        if missing:
            raise ProtocolError(f"{what}: no step makes the pipeline output(s) {', '.join(missing)}")


Step = Callable[[PipelineStep, dict[str, Any]], Mapping[str, Any]]


def run_steps(spec: PipelineSpec, feeds: Mapping[str, Any], run: Step, outputs: tuple[str, ...]) -> dict[str, Any]:
    """The pipeline's answer: each step in order, ``run(step, its feeds by its input names)`` -> its outputs by name.

    Returns the tensors named ``outputs``. A step that does not answer an output its mapping names
    is an error (KeyError naming the step and the output)."""
    tensors: dict[str, Any] = dict(feeds)
    for step in spec.steps:
        answer = run(step, {port: tensors[tensor] for port, tensor in step.inputs})
        for port, tensor in step.outputs:
            if port not in answer:
                raise KeyError(f"pipeline step {step.name!r} gave no output {port!r} (it gave {sorted(answer)})")
            tensors[tensor] = answer[port]
    return {name: tensors[name] for name in outputs}
