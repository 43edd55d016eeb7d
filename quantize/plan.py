"""Which variants to build for a mode and a target profile's precision policy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agent.errors import UserError
from quantize.recipe import CpuFeatures, Family, Mode, Recipe, family_of, recipe_for, where_it_pays

__all__ = ["Plan", "plan_recipes"]

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


def plan_recipes(mode: Mode, profile: Any, cpu: CpuFeatures, keep_io_types: bool, notes: list[str]) -> Plan:
    """The plan for `mode` on the target `profile` (a targets.TargetProfile)."""
    family = family_of([ep.name for ep in profile.execution_providers])
    policy = profile.precision
    make = lambda precision: recipe_for(precision, family, cpu, policy.format, policy.weights,  # noqa: E731
                                        keep_io_types)
    baseline = make("fp32")
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
    notes.append(f"auto: target {profile.name} precision policy is {policy.format}")
    return Plan([baseline, make(precision)] if precision != "fp32" else [baseline], False, family)
