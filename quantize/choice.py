"""Which variant is written: the checks that can rule one out, the pick, and the one-line reasons.

A variant is ruled out when it is not a valid file for its runtimes (quantize.validity), breaks the
format its recipe promises (quantize.rules), is an "fp16" model whose weights are mostly not fp16,
is over the accuracy budget (quantize.budget) or runs worse on the target (quantize.target_check).
Under ``auto`` a ruled-out variant leaves the float model with a note; a mode the user asked for
fails with the reason and the flag that would help (exit 5), never an internal error.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from edgecore.errors import OperationFailed
from quantize.nncf_ptq import fake_quantize_layers
from quantize.openvino_ir import myriad_problem
from quantize.recipe import Family
from quantize.rules import format_violations, is_quantized, weight_tensors
from quantize.target_check import TargetCheck
from quantize.validity import onnx_problems
from quantize.variants import Variant

__all__ = ["FP16_SHARE_NEEDED", "Choice", "choose", "fp16_share", "rule_out"]

FP16_SHARE_NEEDED = 0.9  # below this an "fp16" model is mostly float32: not what an fp16 target runs fast
_MARGIN = 1.03  # auto keeps the float input unless a variant is at least 3% faster


def fp16_share(model: onnx.ModelProto) -> float:
    """Share of the float weight elements (initializers and Constant nodes, subgraphs included) stored as float16."""
    sizes: dict[int, int] = {onnx.TensorProto.FLOAT: 0, onnx.TensorProto.FLOAT16: 0}
    for _, tensor in weight_tensors(model.graph):
        if tensor.data_type in sizes:
            sizes[tensor.data_type] += max(1, _elements(tensor))
    total = sum(sizes.values())
    return sizes[onnx.TensorProto.FLOAT16] / total if total else 0.0


def _elements(tensor: onnx.TensorProto) -> int:
    count = 1
    for d in tensor.dims:
        count *= d
    return count


def rule_out(variant: Variant, family: Family, target: str) -> list[str]:
    """Why `variant` must not be written (validity for its runtimes, its format, its real fp16 share); cached."""
    if variant.checked:
        return variant.problems
    variant.checked = True
    v = variant
    if v.ir is not None:  # scoring ran it in OpenVINO: it compiles; MYRIAD's runtime is older
        old = myriad_problem(v.ir) if target == "myriad" else None
        v.problems += [old] if old else []
        if v.recipe.precision == "int8" and not fake_quantize_layers(v.ir):
            v.problems.append("NNCF left no FakeQuantize layer: nothing was quantized")
        share = v.ir.fp16_share() if v.recipe.precision == "fp16" else 1.0
    elif v.recipe.precision == "int8" and v.kept_float and not is_quantized(v.model):
        v.problems.append(f"every quantizable node had to stay float32 for {target} ({len(v.kept_float)} kept "
                          "float): it is the float model, not int8")
        return v.problems
    else:  # your own float model is yours: OpenVINO not loading it is a note of the pipeline's, not a reason here
        v.problems += onnx_problems(v.model, family is Family.OPENVINO and v.recipe.precision != "fp32")
        v.problems += [f"breaks the {family.value} format: {p}" for p in format_violations(v.model, v.recipe,
                                                                                          v.kept_float)]
        share = fp16_share(v.model) if v.recipe.precision == "fp16" else 1.0
    if share < FP16_SHARE_NEEDED:
        v.problems.append(f"only {share:.0%} of its weights are float16 ({len(v.kept_float)} nodes kept float32): "
                          f"not the fp16 model {target} needs")
    return v.problems


@dataclass(frozen=True)
class Choice:
    """The variant to write, or the failure (exit 5) that forbids writing any."""

    variant: Variant
    failure: OperationFailed | None


def choose(variants: list[Variant], pick_fastest: bool, auto: bool, latency: dict[str, Any], latency_key: str,
           checks: dict[str, TargetCheck], family: Family, target: str, output: Path, notes: list[str]) -> Choice:
    """The fastest writable variant within budget (pick_fastest), else the one the plan asked for.

    Variants are checked for writability (rule_out) in the order they would be picked, so a run checks
    only the one it writes unless that one is ruled out.
    """
    def writable(v: Variant) -> bool:
        problems = rule_out(v, family, target)
        if problems:
            notes.append(f"{v.name} ruled out: {problems[0]}")
        return not problems

    float_ = variants[0]
    if pick_fastest:
        within = [v for v in variants if v.accuracy.ok and checks[v.name].fixed]
        for v in variants:
            if not v.accuracy.ok:
                notes.append(f"{v.name} rejected: {v.accuracy.summary()}")
            elif not checks[v.name].fixed:
                notes.append(f"{v.name} rejected: it runs worse on the target than the float model")
        # A variant must beat the float input by a margin, not by measurement noise.
        ranked = sorted(within, key=lambda v: _ms(latency, v.name, latency_key) * (1.0 if v is float_ else _MARGIN))
        chosen = next((v for v in ranked if writable(v)), None)
        if chosen is not None:
            return Choice(chosen, None)
        return Choice(float_, _unwritable(float_, output) if rule_out(float_, family, target) else None)
    asked = variants[-1]
    if not writable(asked):
        if auto and asked is not float_ and writable(float_):
            notes.append(f"auto: kept the float model because {asked.name} cannot be written")
            return Choice(float_, None)
        return Choice(asked, _unwritable(asked, output))
    return Choice(asked, _failure(asked, checks[asked.name], target, output))


def _failure(chosen: Variant, check: TargetCheck, target: str, output: Path) -> OperationFailed | None:
    """Exit 5 rather than write a model that runs worse on the target, or is over the budget."""
    if not check.fixed:
        before, after = check.before, check.after
        return OperationFailed(
            f"target check failed: {chosen.name} runs worse on {target} than the float model "
            f"({before['accelerator_partitions']} -> {after['accelerator_partitions']} accelerator partitions, "
            f"verdict {before['verdict']} -> {after['verdict']}, {len(check.added_fallbacks)} nodes added to CPU"
            f"{'; ' + after['reason'] if after.get('verdict') == 'unknown' else ''}) "
            f"even with {len(check.kept_float)} nodes kept float; nothing written to {output}")
    if not chosen.accuracy.ok:
        return OperationFailed(
            f"accuracy budget not met: {chosen.name} {chosen.accuracy.summary()} (kept {len(chosen.kept_float)} "
            f"nodes float); raise the budget or give --eval data; nothing written to {output}")
    return None


def _unwritable(variant: Variant, output: Path) -> OperationFailed:
    hint = ("the float model is your own file: fix the export" if variant.name == "float" else
            f"--mode auto keeps the float model when {variant.name} cannot be written")
    return OperationFailed(f"{variant.name} cannot be written: {variant.problems[0]}; nothing written to {output} "
                           f"({hint})")


def _ms(latency: dict[str, Any], name: str, key: str) -> float:
    value = latency.get(name, {}).get(key)
    return float(value) if value is not None else float("inf")
