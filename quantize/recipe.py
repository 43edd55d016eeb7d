"""Which quantized format a target needs: the recipe for each mode, per execution-provider family."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path

from onnxruntime.quantization import QuantType

from edgecore.backends.registry import BackendRegistry, default_registry
from edgecore.errors import UserError

__all__ = ["COMPUTE_OPS", "CpuFeatures", "Family", "Mode", "Recipe", "family_of", "nncf_recipe", "recipe_for",
           "where_it_pays"]

# Ops where INT8 pays on CPUs: compute-bound kernels with fused QLinear implementations.
COMPUTE_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")


class Mode(str, Enum):
    """What the user asked for on the command line."""

    INT8 = "int8"
    DYNAMIC = "dynamic"
    FP16 = "fp16"
    AUTO = "auto"


class Family(str, Enum):
    """Execution-provider families that differ in the quantized format they accept."""

    TENSORRT = "tensorrt"
    NNAPI = "nnapi"
    QNN = "qnn"
    OPENVINO = "openvino"
    COREML = "coreml"
    CPU = "cpu"


# Families whose runtime rejects DynamicQuantizeLinear / MatMulInteger, with the reason shown to users.
_NO_DYNAMIC = {
    Family.TENSORRT: "TensorRT has no DynamicQuantizeLinear/MatMulInteger/ConvInteger; use int8 (QDQ) or fp16",
    Family.NNAPI: "NNAPI has no dynamic-range integer ops; every such node would fall back to CPU",
    Family.QNN: "QNN HTP needs static quantization parameters; dynamic ops fall back to CPU",
    Family.OPENVINO: "OpenVINO devices (NPU/VPU) do not run DynamicQuantizeLinear; use int8 or fp16",
    Family.COREML: "the CoreML EP has no DynamicQuantizeLinear/MatMulInteger/ConvInteger; use fp16 (or float)",
}


@dataclass(frozen=True)
class CpuFeatures:
    """Instruction-set flags of the host CPU, read from a cpuinfo file (the seam tests pass in)."""

    flags: frozenset[str]

    @classmethod
    def from_cpuinfo(cls, path: Path = Path("/proc/cpuinfo")) -> CpuFeatures:
        """Parse the first `flags` (x86) or `Features` (ARM) line; an unreadable file gives no flags."""
        try:
            text = path.read_text(errors="replace")
        except OSError:
            return cls(frozenset())
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key.strip().lower() in ("flags", "features"):
                return cls(frozenset(value.split()))
        return cls(frozenset())

    @property
    def x86(self) -> bool:
        """True when the flags look like an x86 CPU."""
        return "sse2" in self.flags

    @property
    def vnni(self) -> bool:
        """True when the CPU has 8-bit dot-product instructions (AVX512-VNNI or AVX-VNNI)."""
        return bool(self.flags & {"avx512_vnni", "avx512vnni", "avx_vnni"})


@dataclass(frozen=True)
class Recipe:
    """One concrete way to produce a model variant, and why it was chosen."""

    name: str
    precision: str  # "fp32", "int8", "dynamic" or "fp16"
    family: Family
    activation_type: QuantType = QuantType.QUInt8
    weight_type: QuantType = QuantType.QInt8
    symmetric_activations: bool = False
    per_channel: bool = True
    reduce_range: bool = False
    quantize_bias: bool = True
    op_types: tuple[str, ...] | None = None
    keep_io_types: bool = True
    container: str = "onnx"  # or "openvino-ir": an OpenVINO IR (OUT.xml + OUT.bin) instead of an ONNX file
    reasons: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready description for the report."""
        return {
            "name": self.name,
            "precision": self.precision,
            "family": self.family.value,
            "activation_type": self.activation_type.name,
            "weight_type": self.weight_type.name,
            "symmetric_activations": self.symmetric_activations,
            "per_channel": self.per_channel,
            "reduce_range": self.reduce_range,
            "op_types": list(self.op_types) if self.op_types else "all",
            "container": self.container,
            "reasons": list(self.reasons),
        }


def family_of(providers: list[str], registry: BackendRegistry | None = None) -> Family:
    """The family of the first accelerator EP in the profile's ordered list (CPU when none).

    Each EP's family is what its backend declares in the agent's backend registry; an EP no
    backend declares, or a family with no recipes here, is a UserError rather than a silent CPU.
    """
    registry = registry or default_registry()
    for ep in providers:
        declared = registry.family_of(ep)
        if declared is None:
            raise UserError(
                f"execution provider {ep!r} is not declared by any agent backend, so its quantized format is "
                f"unknown (declared: {', '.join(sorted(registry.families()))})"
            )
        try:
            fam = Family(declared)
        except ValueError:
            raise UserError(f"execution provider {ep!r} is of quantization family {declared!r}, "
                            f"which has no recipes (known: {', '.join(f.value for f in Family)})") from None
        if fam is not Family.CPU:
            return fam
    return Family.CPU


def recipe_for(precision: str, family: Family, cpu: CpuFeatures, policy_format: str = "fp32",
               policy_weights: str = "int8", keep_io_types: bool = True) -> Recipe:
    """The recipe that produces `precision` in the format the target accepts; refuses what it cannot run.

    `policy_format` and `policy_weights` come from the target profile's precision policy.
    """
    if precision == "fp32":
        return Recipe("float", "fp32", family, reasons=("input model unchanged",))
    if precision == "fp16" and family is Family.OPENVINO:
        return Recipe("fp16", "fp16", family, container="openvino-ir", reasons=(
            "OpenVINO IR with FP16-compressed weights (ov.save_model compress_to_fp16): the device computes in "
            "FP16 on the user's graph, with no Cast pairs",))
    if precision == "fp16":
        return Recipe("fp16", "fp16", family, keep_io_types=keep_io_types,
                      reasons=("onnxruntime.transformers.float16, fp32 I/O kept" if keep_io_types
                               else "onnxruntime.transformers.float16, I/O converted to fp16",))
    if precision == "dynamic":
        if family in _NO_DYNAMIC:
            raise UserError(f"mode dynamic refused for a {family.value} target: {_NO_DYNAMIC[family]}")
        return Recipe("dynamic", "dynamic", family, per_channel=False,
                      reasons=("weights int8, activations quantized at run time",))
    if precision == "int8":
        return _int8_recipe(family, cpu, policy_format, policy_weights)
    raise UserError(f"unknown precision {precision!r} (known: fp32, int8, dynamic, fp16)")


def _int8_recipe(family: Family, cpu: CpuFeatures, policy_format: str, policy_weights: str) -> Recipe:
    if policy_format == "int8-qdq-symmetric" or family is Family.TENSORRT:
        return Recipe(
            "int8", "int8", family, QuantType.QInt8, QuantType.QInt8, symmetric_activations=True,
            quantize_bias=False,
            reasons=("TensorRT explicit quantization: signed int8, zero point 0 everywhere",
                     "bias kept float (TensorRT fuses it)"),
        )
    if policy_format.startswith("uint8") or family in (Family.NNAPI, Family.QNN):
        if policy_weights == "uint8":
            return Recipe("int8", "int8", family, QuantType.QUInt8, QuantType.QUInt8, per_channel=False,
                          reasons=(f"{family.value}: uint8 activations and uint8 per-tensor weights "
                                   "(profile precision policy)",))
        return Recipe(
            "int8", "int8", family, QuantType.QUInt8, QuantType.QInt8,
            reasons=(f"{family.value}: uint8 asymmetric activations (int8 activations fall back to CPU)",
                     "per-channel weights int8 symmetric"),
        )
    base = Recipe("int8", "int8", family, QuantType.QUInt8, QuantType.QInt8,
                  reasons=("uint8 activations (signed int8 activations measured 2-4x slower on CPU)",))
    if family is Family.CPU and cpu.x86 and not cpu.vnni:
        return replace(base, reduce_range=True,
                       reasons=(*base.reasons, "reduce_range: this x86 CPU has no VNNI (7-bit weights avoid "
                                                   "overflow in the u8s8 kernels)"))
    vnni = "VNNI present" if cpu.vnni else "not x86"
    return replace(base, reasons=(*base.reasons, f"full 8-bit range ({vnni})"))


def where_it_pays(recipe: Recipe) -> Recipe:
    """The same recipe restricted to the compute-bound ops."""
    return replace(recipe, name="int8-compute", op_types=COMPUTE_OPS,
                   reasons=(*recipe.reasons, "only " + ", ".join(COMPUTE_OPS) + " quantized"))


def nncf_recipe(family: Family) -> Recipe:
    """INT8 by NNCF post-training quantization, as an OpenVINO IR (quantize.nncf_ptq)."""
    return Recipe("int8-nncf", "int8", family, QuantType.QInt8, QuantType.QInt8, symmetric_activations=True,
                  container="openvino-ir", reasons=("NNCF post-training quantization (performance preset): "
                                                    "FakeQuantize layers OpenVINO runs in INT8",))
