"""The backend registry: built-in declarations, and a toy backend registered through the public seam."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agent.catalog import Candidate, absent_backends, candidate_backends, reference_candidate
from agent.hardware import Accelerator, Cpu, Hardware
from agent.selection import select_backend
from edgecore.backends import Backend, BackendRegistry, Device, HostDevice, Runner, TensorSpec, Verdict, default_registry
from edgecore.backends.base import Placement
from edgecore.backends.onnxruntime import BACKEND as ORT
from edgecore.backends.onnxruntime import OrtRunner, OrtSessionLoader
from edgecore.backends.openvino import BACKEND as OPENVINO
from edgecore.errors import ConfigError, UserError
from edgectl.controller.service import backend_fallback
from quantize.recipe import Family, family_of
from targets import list_profiles
from tests.agent.test_backends import affine_model

TOY_EP = "ToyExecutionProvider"


class ToyRunner(Runner):
    """Runs the model on onnxruntime's CPU underneath, but answers as the toy accelerator would.

    ``scale`` multiplies every output: 1.0 is a correct accelerator, anything else a broken one.
    """

    def __init__(self, model_path: Path, device: str, scale: float) -> None:
        super().__init__(f"toy/{device}")
        self.inner = OrtRunner(OrtSessionLoader(model_path))
        self.device = device
        self.scale = scale

    def activate_impl(self) -> None:
        self.inner.activate()

    def deactivate_impl(self) -> None:
        self.inner.deactivate()

    def inputs_impl(self) -> list[TensorSpec]:
        return self.inner.inputs

    def outputs_impl(self) -> list[TensorSpec]:
        return self.inner.outputs

    def placement_impl(self) -> Placement:
        return Placement(backend="toy", requested=self.device, effective=self.device, verdict=Verdict.FULL)

    def infer_impl(self, feeds: Mapping[str, np.ndarray]) -> dict[str, Any]:
        return {name: value * self.scale for name, value in self.inner.infer_impl(feeds).items()}


def toy_backend(scale: float = 1.0, family: str = "qnn", name: str = "toy") -> Backend:
    return Backend(
        name=name,
        open=lambda path, device, options: ToyRunner(path, device, scale),
        offered=lambda: ["TOY", "TOYCPU"],
        runtime_version=lambda: "0.1",
        accelerators={"toy-npu": (Device("TOY", family, precisions=("fp32", "int8")),)},
        # Every device of this backend is the one ToyExecutionProvider, so they share its family.
        host=(HostDevice(Device("TOYCPU", family), arches=("riscv64",)),),
        provider=TOY_EP,
        rank=5,
        notes={"TOY": "only on boards with a toy NPU"},
    )


def board(*kinds: str, arch: str = "x86_64") -> Hardware:
    cpu = Cpu("test cpu", "test", arch, 4)
    return Hardware("/fake", "linux", cpu, 2**30, tuple(Accelerator(kind, kind) for kind in kinds))


@pytest.fixture
def registry() -> BackendRegistry:
    reg = BackendRegistry([ORT, OPENVINO])
    reg.register(toy_backend())
    return reg


def test_default_registry_discovers_the_builtin_modules() -> None:
    assert default_registry().names()[:2] == ["onnxruntime", "openvino"]
    assert reference_candidate() == Candidate("onnxruntime", "CPUExecutionProvider")
    assert default_registry().provider_of("openvino/NPU") == "OpenVINOExecutionProvider"
    assert default_registry().provider_of("onnxruntime/CUDAExecutionProvider") == "CUDAExecutionProvider"
    assert default_registry().provider_of("tensorflow/GPU") is None


def test_every_shipped_target_names_only_declared_providers() -> None:
    families = default_registry().families()
    for profile in list_profiles():
        for ep in profile.execution_providers:
            assert ep.name in families, f"target {profile.name}: {ep.name} is declared by no backend"


def test_toy_backend_becomes_a_candidate_ranked_first(registry: BackendRegistry) -> None:
    offered = {"onnxruntime": ["CPUExecutionProvider"], "openvino": ["CPU"]}
    found = candidate_backends(board("toy-npu"), offered=offered, registry=registry)
    assert [c.name for c in found] == ["toy/TOY", "onnxruntime/CPUExecutionProvider", "openvino/CPU"]
    assert [c.name for c in candidate_backends(board(), offered=offered, registry=registry)] == [
        "onnxruntime/CPUExecutionProvider", "openvino/CPU"]
    riscv = candidate_backends(board(arch="riscv64"), offered=offered, registry=registry)
    assert [c.name for c in riscv] == ["toy/TOYCPU", "onnxruntime/CPUExecutionProvider"]
    assert [c.name for c in candidate_backends(board("toy-npu"), [TOY_EP], offered=offered, registry=registry)] == ["toy/TOY"]
    assert candidate_backends(board("toy-npu"), offered={**offered, "toy": []}, registry=registry)[0].backend == "onnxruntime"


def test_absent_toy_device_says_why(registry: BackendRegistry) -> None:
    offered = {"onnxruntime": ["CPUExecutionProvider"], "openvino": ["CPU"], "toy": ["TOYCPU"]}
    absent = {a.name: a.reason for a in absent_backends(board(), offered=offered, registry=registry)}
    assert absent["toy/TOY"] == "needs toy-npu hardware: none found (only on boards with a toy NPU)"
    assert absent["toy/TOYCPU"] == "needs riscv64 on any OS: this is x86_64 on linux"
    absent = {a.name: a.reason for a in absent_backends(board("toy-npu"), offered={**offered, "toy": []}, registry=registry)}
    assert absent["toy/TOY"].startswith("toy is not installed")
    absent = {a.name: a.reason for a in absent_backends(board("toy-npu"), offered=offered, registry=registry)}
    assert absent["toy/TOY"] == "the installed toy does not offer TOY (only on boards with a toy NPU)"
    everything = {**offered, "toy": ["TOY", "TOYCPU"]}
    assert "toy/TOY" not in {a.name for a in absent_backends(board("toy-npu"), offered=everything, registry=registry)}


def test_quantizer_reads_the_declared_family(registry: BackendRegistry) -> None:
    assert family_of([TOY_EP, "CPUExecutionProvider"], registry) is Family.QNN
    assert family_of(["XnnpackExecutionProvider", "CPUExecutionProvider"], registry) is Family.CPU
    with pytest.raises(UserError, match="'MartianExecutionProvider' is not declared by any agent backend"):
        family_of(["MartianExecutionProvider", "CPUExecutionProvider"], registry)
    odd = BackendRegistry([toy_backend(family="martian")])
    with pytest.raises(UserError, match="family 'martian', which has no recipes"):
        family_of([TOY_EP], odd)


def test_registration_refuses_duplicates_and_conflicting_families(registry: BackendRegistry) -> None:
    with pytest.raises(ConfigError, match="backend 'toy' is already registered"):
        registry.register(toy_backend())
    with pytest.raises(ConfigError, match="declares ToyExecutionProvider as quantization family 'tensorrt'"):
        registry.register(toy_backend(family="tensorrt", name="toy2"))
    mixed = Backend("mixed", ORT.open, ORT.offered, ORT.runtime_version, provider="MixedExecutionProvider",
                    host=(HostDevice(Device("A", "qnn")), HostDevice(Device("B", "nnapi"))))
    with pytest.raises(ConfigError, match="MixedExecutionProvider as quantization family 'nnapi', already declared 'qnn'"):
        registry.register(mixed)
    with pytest.raises(ConfigError, match=r"unknown backend 'nope' \(known: toy, onnxruntime, openvino\)"):
        registry.get("nope")


def test_toy_backend_is_measured_like_any_other(tmp_path: Path, registry: BackendRegistry) -> None:
    model = affine_model(tmp_path / "affine.onnx")
    ort_cpu = Candidate("onnxruntime", "CPUExecutionProvider")
    toy = Candidate("toy", "TOY")
    common: dict[str, Any] = {"hardware": board("toy-npu"), "allowed_providers": None, "golden": None, "expected": None,
                              "time_budget_s": 0.2, "registry": registry}
    selection = select_backend(model, cache_dir=tmp_path / "a", candidates=[toy, ort_cpu], **common)
    figures = {f.backend: f for f in selection.figures}
    assert figures["toy/TOY"].status == "ok" and (figures["toy/TOY"].runs or 0) >= 5
    assert figures["toy/TOY"].placement == Placement("toy", "TOY", "TOY", Verdict.FULL)
    broken = BackendRegistry([ORT, toy_backend(scale=2.0)])
    selection = select_backend(model, cache_dir=tmp_path / "b", candidates=[toy, ort_cpu], **{**common, "registry": broken})
    assert selection.figures[0].status == "rejected" and "off by" in selection.figures[0].reason
    assert selection.backend == ort_cpu.name
    fp16 = select_backend(model, cache_dir=tmp_path / "c", candidates=[toy, ort_cpu], precision="fp16", **common)
    assert fp16.figures[0].reason == "toy/TOY does not run fp16 models (only fp32, int8)"


def test_controller_fallback_gate_reads_the_registry() -> None:
    assert backend_fallback("intel-npu", "openvino/NPU") is False
    assert backend_fallback("intel-npu", "onnxruntime/CPUExecutionProvider") is True
    assert backend_fallback("jetson-orin", "onnxruntime/TensorrtExecutionProvider") is False
    assert backend_fallback("jetson-orin", "something/else") is True
