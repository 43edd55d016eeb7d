"""A pipeline served like a model: a runner whose steps run its models' held runners and its processing graphs.

The runner holds the published entries of the models its steps run (``ModelRegistry.hold``), taken
when it is built: a model swapped afterwards does not change what this runner runs, so a request
through it never mixes versions. A new version of the unit builds a new runner over the new entries
and is published in its place; this one closes when its last request ends and then lets its models
go. Processing graphs (pre/post-processing, ONNX too) run on the reference device, as staging ran them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from agent.catalog import reference_candidate
from agent.serving import PublishedModel
from edgecore.backends.base import Placement, Runner, TensorSpec, Verdict
from edgecore.protocol.manifest import Manifest
from edgecore.protocol.pipeline import PipelineStep, run_steps

__all__ = ["PIPELINE_BACKEND", "PipelineRunner"]

PIPELINE_BACKEND = "pipeline"  # the runner's name: what telemetry reports as a pipeline's backend


class PipelineRunner(Runner):
    """Runs ``manifest``'s steps: model steps on ``members`` (held entries), graph steps on graphs in ``slot_dir``."""

    def __init__(self, manifest: Manifest, slot_dir: Path, members: Mapping[str, PublishedModel],
                 release: Callable[[PublishedModel], None]) -> None:
        super().__init__(PIPELINE_BACKEND)
        assert manifest.pipeline is not None  # a pipeline manifest always has its steps
        self.manifest = manifest
        self.spec = manifest.pipeline
        self.slot_dir = slot_dir
        self.members = dict(members)
        self._release = release
        self._graphs: dict[str, Runner] = {}
        self._outputs = tuple(t.name for t in manifest.outputs)

    def activate_impl(self) -> None:
        candidate = reference_candidate()
        try:
            for graph in self.spec.graphs:
                runner = candidate.open(self.slot_dir / graph)
                runner.activate()
                self._graphs[graph] = runner
        except BaseException:
            self.deactivate_impl()
            raise

    def deactivate_impl(self) -> None:
        graphs, self._graphs = self._graphs, {}
        for runner in graphs.values():
            runner.close()
        members, self.members = self.members, {}
        for entry in members.values():
            self._release(entry)

    def inputs_impl(self) -> list[TensorSpec]:
        return [TensorSpec(t.name, t.dtype, list(t.shape)) for t in self.manifest.inputs]

    def outputs_impl(self) -> list[TensorSpec]:
        return [TensorSpec(t.name, t.dtype, list(t.shape)) for t in self.manifest.outputs]

    def placement_impl(self) -> Placement:
        verdicts = {entry.runner.placement.verdict for entry in self.members.values()}
        verdict = verdicts.pop() if len(verdicts) == 1 else Verdict.PARTIAL
        effective = ", ".join(f"{name}: {entry.runner.name}" for name, entry in sorted(self.members.items()))
        return Placement(PIPELINE_BACKEND, PIPELINE_BACKEND, effective, verdict)

    def infer_impl(self, feeds: Mapping[str, np.ndarray]) -> dict[str, Any]:
        return run_steps(self.spec, feeds, self._step, self._outputs)

    def _step(self, step: PipelineStep, feeds: dict[str, Any]) -> Mapping[str, Any]:
        if step.model is not None:
            return self.members[step.model].runner.infer(feeds)
        return self._graphs[step.graph or ""].infer(feeds)

    def versions(self) -> dict[str, str]:
        """The version of each model this runner runs."""
        return {name: entry.version for name, entry in self.members.items()}
