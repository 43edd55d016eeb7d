"""Which variants to build for a mode and a target profile's precision policy."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from edgecore.errors import UserError
from quantize.nncf_ptq import available as nncf_available
from quantize.recipe import CpuFeatures, Family, Mode, Recipe, family_of, nncf_recipe, recipe_for, where_it_pays

__all__ = ["Plan", "coreml_format", "plan_recipes"]

_POLICY_PRECISION = {
    "fp32": "fp32",
    "fp16": "fp16",
    "int8-qdq-symmetric": "int8",
    "uint8-qdq": "int8",
    "uint8-uint16-qdq": "int8",
}


@dataclass(frozen=True)
class Plan:
    """Recipes to build, the float baseline first; `pick_fastest` chooses by measurement."""

    recipes: list[Recipe]
    pick_fastest: bool
    family: Family


def plan_recipes(mode: Mode, profile: Any, cpu: CpuFeatures, keep_io_types: bool, notes: list[str],
                 registry: Any = None) -> Plan:
    """The plan for `mode` on the target `profile` (a targets.TargetProfile)."""
    if getattr(profile, "unsupported", None) is not None:
        raise UserError(f"target {profile.name} cannot run ONNX models ({profile.unsupported.reason}); "
                        f"see `edgectl targets show {profile.name}` for the conversion path")
    providers = [ep.name for ep in profile.execution_providers]
    family = family_of(providers, registry) if registry is not None else family_of(providers)
    policy = profile.precision
    if family is Family.OPENVINO:
        notes += _runtime_notes(profile)

    def make(precision: str) -> Recipe:
        return recipe_for(precision, family, cpu, policy.format, policy.weights, keep_io_types)

    baseline = make("fp32")
    if family is Family.COREML:
        return _coreml(mode, profile, make, notes)
    if mode is not Mode.AUTO:
        if mode is Mode.INT8 and _POLICY_PRECISION.get(policy.format) == "fp16":
            notes.append(f"target {profile.name} prefers {policy.format} ({policy.notes or 'precision policy'}); "
                         "int8 built as asked")
        return Plan([baseline, make(mode.value)], False, family)
    precision = _POLICY_PRECISION.get(policy.format)
    if precision is None:
        raise UserError(f"target {profile.name}: unknown precision format {policy.format!r}")
    if family is Family.CPU:
        int8 = make("int8")
        notes.append(f"auto on a CPU target: measuring float, INT8 on all ops and INT8 on "
                     f"{', '.join(where_it_pays(int8).op_types or ())}; the fastest within the budget wins")
        return Plan([baseline, int8, where_it_pays(int8)], True, family)
    if family is Family.OPENVINO and precision == "fp32":
        recipes = [baseline, make("int8")]
        if nncf_available():
            recipes.append(nncf_recipe(family))
        else:
            notes.append("NNCF not installed (pip install nncf): its INT8 is not measured beside the QDQ model")
        notes.append(f"auto on an OpenVINO CPU/GPU target: measuring {', '.join(r.name for r in recipes)} with "
                     "OpenVINO at the precision the agent serves; the fastest within the budget wins")
        return Plan(recipes, True, family)
    notes.append(f"auto: target {profile.name} precision policy is {policy.format}")
    return Plan([baseline, make(precision)] if precision != "fp32" else [baseline], False, family)


def _coreml(mode: Mode, profile: Any, make: Callable[[str], Recipe], notes: list[str]) -> Plan:
    """CoreML: fp16 weights for the MLProgram format, the float model for NeuralNetwork; never INT8 QDQ on its own."""
    neural_network = "neuralnetwork" in coreml_format(profile)
    if neural_network:
        why = ("CoreML NeuralNetwork format: onnxruntime's CoreML EP takes float32 tensors only here (float16 only "
               "in MLProgram) and Core ML computes in fp16 on the GPU/Neural Engine itself, so the float model runs "
               "fastest; QuantizeLinear/DequantizeLinear are not in the EP's op list, so INT8 QDQ would fall back to CPU")
        best = "fp32"
    else:
        why = ("CoreML MLProgram format: the EP runs float16 tensors natively, so fp16 weights run fastest at half "
               "the size; QuantizeLinear/DequantizeLinear are not in the EP's op list, so INT8 QDQ would fall back "
               "to CPU")
        best = "fp16"
    notes.append(why)
    baseline = make("fp32")
    if mode is Mode.AUTO:
        return Plan([baseline] if best == "fp32" else [baseline, replace(make(best), reasons=(why,))], False,
                    Family.COREML)
    if mode.value != best:
        notes.append(f"target {profile.name}: {mode.value} built as asked, although {best} runs fastest there")
    return Plan([baseline, make(mode.value)], False, Family.COREML)


def _runtime_notes(profile: Any) -> list[str]:
    """What the device must run for an OpenVINO target: the runtime versions (and how to install them)."""
    notes = []
    for ep in profile.accelerator_providers:
        device = ep.op_support.device or ep.name
        install = getattr(ep, "install", "")
        notes.append(f"{device} needs the OpenVINO runtime {ep.versions} on the device" + (f": {install}" if install else ""))
    return notes


def coreml_format(profile: Any) -> str:
    """"neuralnetwork" or "mlprogram": from the profile's name and its CoreML provider's op-support source."""
    sources = [str(getattr(ep.op_support, "source", "")) for ep in profile.execution_providers]
    text = " ".join([profile.name, *sources]).lower().replace("-", "").replace("_", "")
    return "neuralnetwork" if "neuralnetwork" in text else "mlprogram"
