"""ONNX Runtime backend: any execution provider the installed build offers, placement verified.

After the session is built, ORT's graph assignment info (session config
``session.record_ep_graph_assignment_info=1``, then ``get_provider_graph_assignment_info()``)
says which provider took each node. A requested accelerator that ORT dropped, or that took fewer
than ``min_fraction`` of the nodes, is reported as a fallback, never as the accelerator
(Olive's ``check_ort_fallback`` does the same for dropped providers).

With a compiled-model cache (``edgecore.compiled_cache``) the TensorRT provider gets its engine and
timing caches in a directory keyed by onnxruntime version, provider and model, so a restart reads
the engine instead of building it again (minutes on a Jetson); the load says which it was.

A run whose allocation failed leaves ORT's memory arena sized for that failure: the arena doubles
its next region until it covers the refused request, so the next small request reserves, by 0.9
steps down from there, almost all the address space the process has left (under the agent's
``RLIMIT_AS`` cap, every other allocation then fails). The runner therefore builds a new session
after such a failure; requests still running finish on the old one.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgecore.backends.base import Placement, Runner, TensorSpec, Verdict
from edgecore.backends.registry import Backend, Device, HostDevice
from edgecore.compiled_cache import CacheEntry, LoadFigures, cache_root, entry_for
from edgecore.errors import ModelError
from edgecore.memory_limit import is_out_of_memory
from edgecore.protocol.package import sha256_file

if TYPE_CHECKING:
    import onnxruntime as ort

__all__ = [
    "BACKEND",
    "CPU_PROVIDER",
    "MIN_ACCELERATED_FRACTION",
    "OrtRunner",
    "OrtSessionLoader",
    "available_providers",
    "runtime_version",
]

log = logging.getLogger(__name__)

CPU_PROVIDER = "CPUExecutionProvider"
OPENVINO_EP = "OpenVINOExecutionProvider"
TENSORRT_EP = "TensorrtExecutionProvider"
# Below this share of the graph's nodes, an accelerator mostly ships tensors back and forth.
MIN_ACCELERATED_FRACTION = 0.5
_RECORD_ASSIGNMENT = "session.record_ep_graph_assignment_info"

_ORT_TO_NUMPY = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(double)": "float64",
    "tensor(int8)": "int8",
    "tensor(int16)": "int16",
    "tensor(int32)": "int32",
    "tensor(int64)": "int64",
    "tensor(uint8)": "uint8",
    "tensor(uint16)": "uint16",
    "tensor(uint32)": "uint32",
    "tensor(uint64)": "uint64",
    "tensor(bool)": "bool",
    "tensor(string)": "object",
}


def available_providers() -> list[str]:
    """Execution providers the installed onnxruntime build offers."""
    import onnxruntime as ort

    return list(ort.get_available_providers())


def runtime_version() -> str:
    """The installed onnxruntime version."""
    import onnxruntime as ort

    return str(ort.__version__)


SessionFactory = Callable[..., Any]


class OrtSessionLoader:
    """Builds an InferenceSession on one provider (CPU fallback implied) with its options.

    ``cache_dir`` is the compiled-model cache's root (default: the process's); only the TensorRT
    provider compiles, so only it uses one. ``session_factory`` builds the session
    (``onnxruntime.InferenceSession``; a seam to see the options a provider absent here would get).
    ``load`` holds the last load's figures."""

    def __init__(
        self,
        model_path: Path,
        provider: str = CPU_PROVIDER,
        provider_options: Mapping[str, Any] | None = None,
        intra_op_threads: int = 0,
        cache_dir: Path | None = None,
        session_factory: SessionFactory | None = None,
    ) -> None:
        self.model_path = Path(model_path)
        self.provider = provider
        self.provider_options = {k: str(v) for k, v in (provider_options or {}).items()}
        self.intra_op_threads = intra_op_threads
        self.cache_dir = cache_dir if cache_dir is not None else cache_root()
        self.session_factory = session_factory
        self.load: LoadFigures | None = None

    def cache_entry(self) -> CacheEntry | None:
        """This model's engine directory (TensorRT only: ``*.engine`` files), None without a cache."""
        if self.cache_dir is None or self.provider != TENSORRT_EP:
            return None
        device = f"{self.provider}.{self.provider_options.get('device_id', '0')}"
        return entry_for(self.cache_dir, "onnxruntime", runtime_version(), device, sha256_file(self.model_path),
                         "*.engine")

    def providers(self, entry: CacheEntry | None) -> list[Any]:
        """The providers list the session is built with: the cache paths added to TensorRT's options."""
        options = dict(self.provider_options)
        if entry is not None:
            options.update(trt_engine_cache_enable="True", trt_engine_cache_path=str(entry.path),
                           trt_timing_cache_enable="True", trt_timing_cache_path=str(entry.path))
        return [(self.provider, options)] + ([CPU_PROVIDER] if self.provider != CPU_PROVIDER else [])

    def __call__(self) -> ort.InferenceSession:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.add_session_config_entry(_RECORD_ASSIGNMENT, "1")
        options.intra_op_num_threads = self.intra_op_threads
        entry = self.cache_entry()
        hit = entry is not None and entry.holds_compiled()
        start = time.perf_counter()
        try:
            with warnings.catch_warnings():
                # ORT warns and drops an unavailable provider; placement reports that instead.
                warnings.simplefilter("ignore")
                session = (self.session_factory or ort.InferenceSession)(str(self.model_path), options,
                                                                         providers=self.providers(entry))
        except Exception as exc:  # onnxruntime raises its own untyped Fail/InvalidGraph errors
            raise ModelError(
                f"{self.model_path.name}: onnxruntime/{self.provider} cannot load it: {exc}"
            ) from exc
        load_ms = (time.perf_counter() - start) * 1000
        self.load = entry.record(hit, load_ms) if entry else LoadFigures("off", round(load_ms, 2))
        return session


class OrtRunner(Runner):
    """Runs a session built by an OrtSessionLoader; thread-safe (ORT sessions are)."""

    def __init__(self, loader: OrtSessionLoader, min_fraction: float = MIN_ACCELERATED_FRACTION):
        super().__init__(f"onnxruntime/{loader.provider}")
        self.loader = loader
        self.min_fraction = min_fraction
        self._session: ort.InferenceSession | None = None
        self._inputs: list[TensorSpec] = []
        self._outputs: list[TensorSpec] = []
        self._placement: Placement | None = None
        self._renewing = threading.Lock()

    def activate_impl(self) -> None:
        session = self.loader()
        self._session = session
        self._inputs = [_spec(arg) for arg in session.get_inputs()]
        self._outputs = [_spec(arg) for arg in session.get_outputs()]
        placement = _placement(session, self.loader.provider, self.min_fraction)
        self._placement = dataclasses.replace(placement, load=self.loader.load.to_dict() if self.loader.load else None)

    def deactivate_impl(self) -> None:
        with self._renewing:  # a renewal in progress does not bring a session back
            self._session = None

    def inputs_impl(self) -> list[TensorSpec]:
        return list(self._inputs)

    def outputs_impl(self) -> list[TensorSpec]:
        return list(self._outputs)

    def placement_impl(self) -> Placement:
        assert self._placement is not None  # activate() ran: _require_active checked it
        return self._placement

    def infer_impl(self, feeds: Mapping[str, np.ndarray]) -> dict[str, Any]:
        session = self._session
        assert session is not None  # activate() ran: _require_active checked it
        names = [spec.name for spec in self._outputs]
        try:
            values = session.run(names, dict(feeds))
        except Exception as exc:  # onnxruntime raises its own untyped errors
            if is_out_of_memory(exc):
                self._renew(session)
            raise
        return dict(zip(names, values, strict=False))

    def _renew(self, failed: ort.InferenceSession) -> None:
        """Replace the session whose arena a failed allocation oversized: once, by the first thread to get here (the
        others go on failing their own requests meanwhile), and only with a session placed as the old one was."""
        if not self._renewing.acquire(blocking=False):
            return
        try:
            if self._session is not failed:
                return
            try:
                fresh = self.loader()
                placement = _placement(fresh, self.loader.provider, self.min_fraction)
            except Exception as exc:  # whatever stops a fresh session, the old one goes on serving
                log.warning("%s: no fresh session after a failed allocation, keeping the old one: %s", self.name, exc)
                return
            assert self._placement is not None
            if (placement.verdict, placement.effective) != (self._placement.verdict, self._placement.effective):
                log.warning("%s: a fresh session after a failed allocation runs %s (%s), not %s: keeping the old one",
                            self.name, placement.effective, placement.verdict.value, self._placement.effective)
                return
            self._session = fresh  # deactivate waits for this lock: a runner deactivated meanwhile is not revived
        finally:
            self._renewing.release()


def _spec(arg: Any) -> TensorSpec:
    """TensorSpec of an ORT NodeArg; non-tensor types (ONNX-ML maps) become ``object``."""
    dtype = _ORT_TO_NUMPY.get(arg.type, "object")
    shape = list(arg.shape) if arg.type.startswith("tensor(") else []
    return TensorSpec(arg.name, dtype, shape)


def _placement(session: ort.InferenceSession, requested: str, min_fraction: float) -> Placement:
    """Nodes per provider and whether the requested provider really took the graph."""
    nodes: Counter[str] = Counter()
    for subgraph in session.get_provider_graph_assignment_info():
        nodes[subgraph.ep_name] += len(subgraph.get_nodes())
    total = sum(nodes.values())
    taken = nodes.get(requested, 0)
    fraction = taken / total if total else 0.0
    if requested == CPU_PROVIDER:
        verdict = Verdict.CPU
    elif requested not in session.get_providers() or taken == 0:
        verdict = Verdict.NONE
    elif fraction < min_fraction:
        verdict = Verdict.FALLBACK
    else:
        verdict = Verdict.FULL if taken == total else Verdict.PARTIAL
    return Placement(
        backend="onnxruntime",
        requested=requested,
        effective=requested if verdict in (Verdict.CPU, Verdict.FULL, Verdict.PARTIAL) else CPU_PROVIDER,
        verdict=verdict,
        nodes=dict(nodes),
        total_nodes=total,
        accelerated_fraction=round(fraction, 4),
    )


def _open(model_path: Path, provider: str, options: Mapping[str, str]) -> Runner:
    return OrtRunner(OrtSessionLoader(model_path, provider, options))


_NVIDIA = (Device(TENSORRT_EP, "tensorrt"), Device("CUDAExecutionProvider", "tensorrt"))
COREML_EP = "CoreMLExecutionProvider"
# Both model formats the CoreML EP builds: they take different ops, so each is measured. CoreML
# computes in fp32 or fp16 and runs no quantized graph.
_COREML = tuple(
    Device(COREML_EP, "coreml", {"ModelFormat": fmt, "MLComputeUnits": "ALL"}, ("fp32", "fp16"))
    for fmt in ("MLProgram", "NeuralNetwork")
)

BACKEND = Backend(
    name="onnxruntime",
    open=_open,
    offered=available_providers,
    runtime_version=runtime_version,
    accelerators={
        "jetson": _NVIDIA,
        "nvidia-gpu": _NVIDIA,
        "nnapi": (Device("NnapiExecutionProvider", "nnapi"),),
        "qualcomm": (Device("QNNExecutionProvider", "qnn", {"backend_path": "libQnnHtp.so"}),),
        "intel-npu": (Device(OPENVINO_EP, "openvino", {"device_type": "NPU"}),),
        "intel-gpu": (Device(OPENVINO_EP, "openvino", {"device_type": "GPU"}),),
        # The MYRIAD plugin computes in fp16 and has no int8 kernels.
        "movidius": (Device(OPENVINO_EP, "openvino", {"device_type": "MYRIAD"}, ("fp32", "fp16")),),
        "apple-silicon": _COREML,
    },
    host=(
        HostDevice(Device(OPENVINO_EP, "openvino", {"device_type": "CPU"}), ("x86_64", "aarch64"), ("linux",)),
        HostDevice(Device("XnnpackExecutionProvider", "cpu"), ("aarch64", "armv7l")),
        HostDevice(Device(CPU_PROVIDER, "cpu")),
    ),
    reference=CPU_PROVIDER,
    rank=10,
    notes={COREML_EP: "CoreML runs on Apple silicon under macOS, in onnxruntime's macOS and iOS builds"},
)
