"""Native OpenVINO runtime backend: CPU, GPU, NPU and MYRIAD, whichever plugins the device has.

Compiled models are shared between threads but an InferRequest is not, so the runner keeps a
small pool of requests: concurrent ``infer`` calls each borrow one.
"""

from __future__ import annotations

import queue
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from agent.backends.base import Placement, Runner, TensorSpec, Verdict
from agent.backends.registry import Backend, Device, HostDevice
from agent.errors import ModelError, one_line

if TYPE_CHECKING:
    import openvino as ov

__all__ = ["BACKEND", "OvModelLoader", "OvRunner", "available_devices", "runtime_version"]

# Latency for one request at a time, and f32 on CPU so that a CPU with bf16/AMX does not silently
# trade accuracy for speed: quantized models carry their own precision.
DEFAULT_CONFIG: dict[str, dict[str, str]] = {
    "CPU": {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32"},
}

_core: ov.Core | None = None


def _shared_core() -> ov.Core:
    """One Core per process: creating it loads the plugin registry."""
    global _core
    if _core is None:
        import openvino as ov

        _core = ov.Core()
    return _core


def available_devices() -> list[str]:
    """OpenVINO devices the installed plugins see on this machine (e.g. ``["CPU", "NPU"]``)."""
    return list(_shared_core().available_devices)


def runtime_version() -> str:
    """The installed OpenVINO version."""
    import openvino as ov

    return str(ov.__version__).split("-")[0]


class OvModelLoader:
    """Reads an ONNX model and compiles it for one OpenVINO device with its config."""

    def __init__(
        self, model_path: Path, device: str = "CPU", config: Mapping[str, Any] | None = None
    ) -> None:
        self.model_path = Path(model_path)
        self.device = device
        base = DEFAULT_CONFIG.get(device.split(".")[0], {})
        self.config = {**base, **{k: str(v) for k, v in (config or {}).items()}}

    def __call__(self) -> ov.CompiledModel:
        core = _shared_core()
        try:
            model = core.read_model(str(self.model_path))
            return core.compile_model(model, self.device, self.config)
        except RuntimeError as exc:  # OpenVINO reports conversion and plugin errors this way
            raise ModelError(f"{self.model_path.name}: openvino/{self.device} cannot load it: {one_line(exc)}") from exc


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
        devices = list(self._compiled.get_property("EXECUTION_DEVICES"))
        requested = self.loader.device
        on_device = any(d.split(".")[0] == requested.split(".")[0] for d in devices)
        verdict = Verdict.CPU if requested == "CPU" else (Verdict.FULL if on_device else Verdict.NONE)
        return Placement("openvino", requested, ",".join(devices), verdict, config=dict(self.loader.config))

    def infer_impl(self, feeds: Mapping[str, np.ndarray]) -> dict[str, Any]:
        compiled = self._compiled
        assert compiled is not None
        try:
            request = self._requests.get_nowait()
        except queue.Empty:
            request = compiled.create_infer_request()
        try:
            results = request.infer(dict(feeds))
            # Copy: the request reuses its output buffers on the next call.
            return {name: np.array(results[i]) for i, name in enumerate(self._output_names)}
        finally:
            self._requests.put(request)


def _spec(port: Any) -> TensorSpec:
    """TensorSpec of a compiled model port; dynamic dims become None."""
    import openvino as ov

    shape = [dim.get_length() if dim.is_static else None for dim in port.get_partial_shape()]
    element = port.get_element_type()
    dtype = "object" if element == ov.Type.string else str(np.dtype(element.to_dtype()))
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
