"""Native OpenVINO runtime backend: CPU, GPU, NPU and MYRIAD, whichever plugins the device has.

Compiled models are shared between threads but an InferRequest is not, so the runner keeps a
small pool of requests: concurrent ``infer`` calls each borrow one.

Two API generations are driven by the same code: OpenVINO 2023.0 and later (``openvino.Core``), and
2022.3 LTS, the last release with the MYRIAD plugin, whose API lives in ``openvino.runtime`` only.
Only calls both have are used: outputs are read from the request's tensors (2022.3's ``infer``
returns a plain dict keyed by port), the string type and ``EXECUTION_DEVICES`` are optional.

With a compiled-model cache (``edgecore.compiled_cache``) the loader gives OpenVINO a ``CACHE_DIR``
keyed by OpenVINO version, device and model, and reports whether the load compiled or read the cache.
"""

from __future__ import annotations

import queue
import time
import types
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgecore.backends.base import Placement, Runner, TensorSpec, Verdict
from edgecore.backends.registry import Backend, Device, HostDevice
from edgecore.compiled_cache import CacheEntry, LoadFigures, cache_root, entry_for
from edgecore.errors import ModelError, one_line
from edgecore.protocol.package import sha256_file

if TYPE_CHECKING:
    import openvino as ov

__all__ = ["BACKEND", "OvModelLoader", "OvRunner", "available_devices", "installed_plugins", "runtime_version"]

# Devices whose plugin a profile may need; installed_plugins says which this OpenVINO has.
PLUGINS = ("CPU", "GPU", "NPU", "MYRIAD", "HDDL", "GNA")

# Latency for one request at a time, and f32 on CPU so that a CPU with bf16/AMX does not silently
# trade accuracy for speed: quantized models carry their own precision.
DEFAULT_CONFIG: dict[str, dict[str, str]] = {
    "CPU": {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32"},
}

_core: ov.Core | None = None


def api() -> types.ModuleType:
    """The module holding OpenVINO's runtime API: ``openvino`` (2023.0+) or ``openvino.runtime`` (2022.3 LTS)."""
    import openvino

    if hasattr(openvino, "Core"):
        current: types.ModuleType = openvino
        return current
    import openvino.runtime as runtime  # 2022.3 LTS

    lts: types.ModuleType = runtime
    return lts


def _shared_core() -> ov.Core:
    """One Core per process: creating it loads the plugin registry."""
    global _core
    if _core is None:
        _core = api().Core()
    return _core


def available_devices() -> list[str]:
    """OpenVINO devices the installed plugins see on this machine (e.g. ``["CPU", "NPU"]``)."""
    return list(_shared_core().available_devices)


def installed_plugins() -> list[str]:
    """Devices whose plugin this OpenVINO has and can load, with or without the device (what a profile needs)."""
    found = []
    for device in PLUGINS:
        try:
            if device in _shared_core().get_versions(device):
                found.append(device)
        except RuntimeError:  # no such plugin, or its library cannot load (the GPU plugin without OpenCL)
            continue
    return found


def runtime_version() -> str:
    """The installed OpenVINO version (``2026.4.1``; ``get_version`` exists in both API generations)."""
    return str(api().get_version()).split("-")[0]


class OvModelLoader:
    """Reads an ONNX model and compiles it for one OpenVINO device with its config.

    ``cache_dir`` is the compiled-model cache's root (default: the process's, ``edgecore.compiled_cache``;
    None and no process cache: compile every time). ``load`` holds the last load's figures."""

    def __init__(
        self, model_path: Path, device: str = "CPU", config: Mapping[str, Any] | None = None,
        cache_dir: Path | None = None,
    ) -> None:
        self.model_path = Path(model_path)
        self.device = device
        base = DEFAULT_CONFIG.get(device.split(".")[0], {})
        self.config = {**base, **{k: str(v) for k, v in (config or {}).items()}}
        self.cache_dir = cache_dir if cache_dir is not None else cache_root()
        self.load: LoadFigures | None = None

    def cache_entry(self) -> CacheEntry | None:
        """This model's directory in the cache (OpenVINO writes ``*.blob`` files there), None without a cache."""
        if self.cache_dir is None:
            return None
        return entry_for(self.cache_dir, "openvino", runtime_version(), self.device, sha256_file(self.model_path), "*.blob")

    def __call__(self) -> ov.CompiledModel:
        core = _shared_core()
        entry = self.cache_entry()
        config = {**self.config, **({"CACHE_DIR": str(entry.path)} if entry else {})}
        hit = entry is not None and entry.holds_compiled()
        start = time.perf_counter()
        try:
            model = core.read_model(str(self.model_path))
            compiled = core.compile_model(model, self.device, config)
        except RuntimeError as exc:  # OpenVINO reports conversion and plugin errors this way
            raise ModelError(f"{self.model_path.name}: openvino/{self.device} cannot load it: {one_line(exc)}") from exc
        load_ms = (time.perf_counter() - start) * 1000
        self.load = entry.record(hit, load_ms) if entry else LoadFigures("off", round(load_ms, 2))
        return compiled


class OvRunner(Runner):
    """Runs a compiled OpenVINO model; thread-safe through a pool of infer requests."""

    def __init__(self, loader: OvModelLoader) -> None:
        super().__init__(f"openvino/{loader.device}")
        self.loader = loader
        self._compiled: ov.CompiledModel | None = None
        self._requests: queue.SimpleQueue[ov.InferRequest] = queue.SimpleQueue()
        self._inputs: list[TensorSpec] = []
        self._outputs: list[TensorSpec] = []
        self._output_names: list[str] = []

    def activate_impl(self) -> None:
        compiled = self.loader()
        self._compiled = compiled
        self._inputs = [_spec(port) for port in compiled.inputs]
        self._outputs = [_spec(port) for port in compiled.outputs]
        self._output_names = [spec.name for spec in self._outputs]
        self._requests = queue.SimpleQueue()
        self._requests.put(compiled.create_infer_request())

    def deactivate_impl(self) -> None:
        self._compiled = None
        self._requests = queue.SimpleQueue()

    def inputs_impl(self) -> list[TensorSpec]:
        return list(self._inputs)

    def outputs_impl(self) -> list[TensorSpec]:
        return list(self._outputs)

    def placement_impl(self) -> Placement:
        assert self._compiled is not None
        requested = self.loader.device
        try:
            devices = list(self._compiled.get_property("EXECUTION_DEVICES"))
        except RuntimeError:  # 2022.3 has no EXECUTION_DEVICES: a plain device name compiles there or fails
            devices = [requested]
        on_device = any(d.split(".")[0] == requested.split(".")[0] for d in devices)
        verdict = Verdict.CPU if requested == "CPU" else (Verdict.FULL if on_device else Verdict.NONE)
        return Placement("openvino", requested, ",".join(devices), verdict, config=dict(self.loader.config),
                         load=self.loader.load.to_dict() if self.loader.load else None)

    def infer_impl(self, feeds: Mapping[str, np.ndarray]) -> dict[str, Any]:
        compiled = self._compiled
        assert compiled is not None
        try:
            request = self._requests.get_nowait()
        except queue.Empty:
            request = compiled.create_infer_request()
        try:
            # In output order: 2023.0+ answers an OVDict, 2022.3 a plain dict keyed by port (no int keys).
            values = list(request.infer(dict(feeds)).values())
            # Copy: the request reuses its output buffers on the next call.
            return {name: np.array(values[i]) for i, name in enumerate(self._output_names)}
        finally:
            self._requests.put(request)


def _spec(port: Any) -> TensorSpec:
    """TensorSpec of a compiled model port; dynamic dims become None."""
    shape = [dim.get_length() if dim.is_static else None for dim in port.get_partial_shape()]
    element = port.get_element_type()
    string = getattr(api().Type, "string", None)  # 2024.0 added string tensors
    dtype = "object" if string is not None and element == string else str(np.dtype(element.to_dtype()))
    return TensorSpec(_port_name(port), dtype, shape)


def _port_name(port: Any) -> str:
    """The ONNX tensor name of a port.

    A port can carry several names once OpenVINO folds an Identity into its producer
    (``{"t2", "y"}``); the graph output's own name is the one in its Result's friendly name.
    """
    names = port.get_names()
    node_name = port.get_node().get_friendly_name().removesuffix("/sink_port_0")
    return str(node_name if node_name in names else port.get_any_name())


def _open(model_path: Path, device: str, config: Mapping[str, str]) -> Runner:
    return OvRunner(OvModelLoader(model_path, device, config))


BACKEND = Backend(
    name="openvino",
    open=_open,
    offered=available_devices,
    runtime_version=runtime_version,
    accelerators={
        "intel-npu": (Device("NPU", "openvino"),),
        "intel-gpu": (Device("GPU", "openvino"),),
        # The MYRIAD plugin computes in fp16 and has no int8 kernels.
        "movidius": (Device("MYRIAD", "openvino", precisions=("fp32", "fp16")),),
    },
    host=(HostDevice(Device("CPU", "openvino"), ("x86_64", "aarch64"), ("linux",)),),
    provider="OpenVINOExecutionProvider",
    rank=20,
)
