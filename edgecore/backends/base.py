"""The runner contract every backend implements (after Polygraphy's ``backend/base/runner.py``).

A *loader* knows how to build a session (which runtime, device, options); a *runner* owns that
session: ``activate`` builds it, ``infer`` runs it, ``deactivate`` frees it. Runners are context
managers. The base class owns the checks on the feeds, so a backend only implements the
``*_impl`` methods and every backend rejects bad inputs with the same messages.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import TracebackType
from typing import Any

import numpy as np

from edgecore.errors import InternalError, UserError

__all__ = ["Dim", "Placement", "Runner", "TensorSpec", "Verdict"]

Dim = int | str | None


@dataclass(frozen=True)
class TensorSpec:
    """Name, numpy dtype string and shape of one model input or output.

    A dimension is an ``int`` when fixed, a ``str`` when symbolic (``"batch"``) and ``None`` when
    unknown. ``dtype`` is ``"object"`` for strings and for non-tensor outputs (ONNX-ML maps).
    """

    name: str
    dtype: str
    shape: list[Dim] = field(default_factory=list)

    def accepts_shape(self, shape: tuple[int, ...]) -> bool:
        """Whether a concrete shape fits this spec (same rank, fixed dims equal)."""
        if len(shape) != len(self.shape):
            return False
        return all(not isinstance(want, int) or want == got for want, got in zip(self.shape, shape, strict=False))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}


class Verdict(str, Enum):
    """Whether the requested device really runs the model."""

    CPU = "cpu"  # the CPU was asked for and runs it
    FULL = "full"  # the accelerator took every node
    PARTIAL = "partial"  # the accelerator took most nodes, the CPU the rest
    FALLBACK = "fallback"  # the accelerator took too few nodes to count
    NONE = "none"  # the accelerator took nothing: the CPU runs it all


@dataclass(frozen=True)
class Placement:
    """Where a model really runs: backend, requested and effective device, verdict.

    onnxruntime adds the nodes per provider (of the optimized graph) and the accelerated share;
    OpenVINO the compile config. ``load`` is the compiled-model cache's word on this load
    (``edgecore.compiled_cache.LoadFigures``). ``to_dict`` leaves out what a backend does not report.
    """

    backend: str
    requested: str
    effective: str
    verdict: Verdict
    nodes: Mapping[str, int] | None = None
    total_nodes: int | None = None
    accelerated_fraction: float | None = None
    config: Mapping[str, str] | None = None
    load: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "verdict", Verdict(self.verdict))

    @property
    def accelerated(self) -> bool:
        """False when a requested accelerator took no or too few nodes (CPU in disguise)."""
        return self.verdict not in (Verdict.NONE, Verdict.FALLBACK)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, as reported in selection figures and telemetry."""
        data: dict[str, Any] = {"backend": self.backend, "requested": self.requested, "effective": self.effective,
                                "verdict": self.verdict.value}
        if self.nodes is not None:
            data.update(nodes=dict(self.nodes), total_nodes=self.total_nodes,
                        accelerated_fraction=self.accelerated_fraction)
        if self.config is not None:
            data["config"] = dict(self.config)
        if self.load is not None:
            data["load"] = dict(self.load)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Placement:
        """Inverse of ``to_dict``."""
        nodes = data.get("nodes")
        config = data.get("config")
        total = data.get("total_nodes")
        fraction = data.get("accelerated_fraction")
        load = data.get("load")
        return cls(
            backend=str(data["backend"]), requested=str(data["requested"]), effective=str(data["effective"]),
            verdict=Verdict(data["verdict"]),
            nodes={str(k): int(v) for k, v in nodes.items()} if nodes is not None else None,
            total_nodes=int(total) if total is not None else None,
            accelerated_fraction=float(fraction) if fraction is not None else None,
            config={str(k): str(v) for k, v in config.items()} if config is not None else None,
            load=dict(load) if isinstance(load, Mapping) else None,
        )


class Runner(abc.ABC):
    """A loaded model on one backend: activate, infer, deactivate; use it with ``with``.

    ``infer`` may be called from several threads at once once the runner is active; backends
    whose sessions are not thread-safe serialise or pool internally.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.is_active = False
        self._state_lock = threading.Lock()

    # -- lifecycle -------------------------------------------------------------------------------
    def activate(self) -> None:
        """Build the session; calling it on an active runner is an internal error."""
        with self._state_lock:
            if self.is_active:
                raise InternalError(f"runner {self.name} is already active")
            self.activate_impl()
            self.is_active = True

    def deactivate(self) -> None:
        """Free the session; a no-op on an inactive runner so cleanup paths never raise."""
        with self._state_lock:
            if not self.is_active:
                return
            self.is_active = False
            self.deactivate_impl()

    close = deactivate

    def __enter__(self) -> Runner:
        if not self.is_active:
            self.activate()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.deactivate()

    # -- metadata --------------------------------------------------------------------------------
    @property
    def inputs(self) -> list[TensorSpec]:
        """The model inputs, in model order."""
        self._require_active()
        return self.inputs_impl()

    @property
    def outputs(self) -> list[TensorSpec]:
        """The model outputs, in model order."""
        self._require_active()
        return self.outputs_impl()

    @property
    def placement(self) -> Placement:
        """Where the model really runs: backend, device, nodes per provider, fallback verdict."""
        self._require_active()
        return self.placement_impl()

    # -- inference -------------------------------------------------------------------------------
    def infer(self, feeds: Mapping[str, np.ndarray], *, check: bool = True) -> dict[str, Any]:
        """Run the model on ``feeds``; raise UserError naming the tensor when a feed is wrong."""
        self._require_active()
        if check:
            self.check_feeds(feeds)
        return self.infer_impl(feeds)

    def check_feeds(self, feeds: Mapping[str, np.ndarray]) -> None:
        """Raise UserError when a name, dtype or shape does not match the model inputs."""
        specs = {spec.name: spec for spec in self.inputs}
        for name in feeds:
            if name not in specs:
                raise UserError(f"unknown input '{name}': the model's inputs are {sorted(specs)}")
        for spec in specs.values():
            if spec.name not in feeds:
                raise UserError(f"missing input '{spec.name}' ({spec.dtype}{spec.shape})")
            _check_one(spec, feeds[spec.name])

    def _require_active(self) -> None:
        if not self.is_active:
            raise InternalError(f"runner {self.name} is not active: use it in a `with` block")

    # -- what a backend implements ---------------------------------------------------------------
    @abc.abstractmethod
    def activate_impl(self) -> None:
        """Build the session."""

    @abc.abstractmethod
    def deactivate_impl(self) -> None:
        """Release the session."""

    @abc.abstractmethod
    def inputs_impl(self) -> list[TensorSpec]:
        """Input specs of the active session."""

    @abc.abstractmethod
    def outputs_impl(self) -> list[TensorSpec]:
        """Output specs of the active session."""

    @abc.abstractmethod
    def placement_impl(self) -> Placement:
        """Placement report of the active session."""

    @abc.abstractmethod
    def infer_impl(self, feeds: Mapping[str, np.ndarray]) -> dict[str, Any]:
        """Run the checked feeds."""


def _check_one(spec: TensorSpec, value: Any) -> None:
    """Raise UserError when one feed's type, dtype or shape does not fit its spec."""
    if not isinstance(value, np.ndarray):
        raise UserError(f"input '{spec.name}' must be a numpy array, got {type(value).__name__}")
    got = value.dtype
    if spec.dtype == "object":
        if got.kind not in "OUS":
            raise UserError(f"input '{spec.name}' expects strings, got dtype {got}")
    elif got != np.dtype(spec.dtype):
        raise UserError(f"input '{spec.name}' expects dtype {spec.dtype}, got {got}")
    if not spec.accepts_shape(value.shape):
        raise UserError(
            f"input '{spec.name}' expects shape {spec.shape}, got {list(value.shape)}"
        )
