"""Quantization must not add partitions or CPU fallbacks on the target: check with targets.analyse, then fix."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import onnx

from quantize.rules import QUANT_OPS
from quantize.variants import Variant, VariantBuilder

__all__ = ["TargetCheck", "check_target"]

_FIX_ROUNDS = 3


@dataclass
class TargetCheck:
    """Target analysis of the float input and of the variant, and what was kept float to match."""

    before: dict[str, Any]
    after: dict[str, Any]
    added_fallbacks: list[str] = field(default_factory=list)
    kept_float: list[str] = field(default_factory=list)
    fixed: bool = True

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (full per-node analysis stays with `edgectl targets`)."""
        return {"before": self.before, "after": self.after, "added_fallbacks": self.added_fallbacks,
                "kept_float_for_target": self.kept_float, "ok": self.fixed}


_VERDICT_RANK = {"NO": 0, "MAYBE": 1, "YES": 2}


def check_target(float_model: onnx.ModelProto, variant: Variant, profile: Any, builder: VariantBuilder,
                 before: Any = None) -> TargetCheck:
    """Analyse before and after; keep offending nodes float (INT8 or FP16) until the target is no worse.

    `before` is the float model's analysis when the caller already has it (it is the same for every variant).
    """
    import targets  # host-only package

    before = before if before is not None else targets.analyse(float_model, profile)
    on_accel = {n.name for n in before.nodes if n.accelerator}
    check = TargetCheck(_summary(before), {})
    for _ in range(_FIX_ROUNDS + 1):
        try:
            after = targets.analyse(variant.model, profile)
        except (ValueError, RuntimeError, KeyError) as exc:  # e.g. onnxruntime's checker on a QDQ subgraph model
            check.after = {"verdict": "unknown", "reason": f"target analysis failed: {str(exc).splitlines()[0][:200]}",
                           "accelerator_partitions": "unknown"}
            check.fixed = False
            return check
        check.after = _summary(after)
        offending = _offending(after, on_accel) if profile.accelerator_providers else []
        offending += _new_partitions(after, on_accel) if after.accelerator_partitions > before.accelerator_partitions else []
        check.added_fallbacks = sorted(set(offending))
        if not _worse(before, after, offending):
            check.fixed = True
            return check
        if variant.recipe.precision not in ("int8", "fp16"):
            break
        kept = set(variant.kept_float)
        keep = _original_nodes(variant.model, offending) - kept
        if not keep:
            break
        builder.rebuild(variant, kept | keep)
        if set(variant.kept_float) == kept:  # none of them can stay float (e.g. an If whose branches read fp16)
            break
        check.kept_float += sorted(set(variant.kept_float) - kept)
    check.fixed = False
    return check


def _worse(before: Any, after: Any, offending: list[str]) -> bool:
    return (after.accelerator_partitions > before.accelerator_partitions or bool(offending)
            or _VERDICT_RANK.get(after.verdict, 0) < _VERDICT_RANK.get(before.verdict, 0))


def _new_partitions(after: Any, on_accel_before: set[str]) -> list[str]:
    """Nodes of accelerator partitions made only of nodes that ran on the CPU before (QDQ nodes grew a
    group past the profile's minimum partition size, so the graph now splits there)."""
    names = [n.name for n in after.nodes]
    found: list[str] = []
    for partition in after.partitions:
        members = [names[i] for i in partition.nodes]
        originals = [after.nodes[i] for i in partition.nodes if after.nodes[i].op_type not in QUANT_OPS]
        if partition.accelerator and not any(n.name in on_accel_before for n in originals):
            found += members
    return found


def _summary(analysis: Any) -> dict[str, Any]:
    cpu_nodes = [n.name for n in analysis.nodes if not n.accelerator]
    return {"verdict": analysis.verdict, "reason": analysis.reason,
            "accelerator_partitions": analysis.accelerator_partitions,
            "accelerator_node_share": round(analysis.accelerator_node_share, 4), "cpu_nodes": len(cpu_nodes)}


def _offending(after: Any, on_accel_before: set[str]) -> list[str]:
    """Nodes on the CPU now: QDQ nodes inserted there, or float nodes that left the accelerator."""
    return [n.name for n in after.nodes
            if not n.accelerator and (n.op_type in QUANT_OPS or n.name in on_accel_before)]


def _original_nodes(model: onnx.ModelProto, names: list[str]) -> set[str]:
    """The float-model nodes around the offending ones (QDQ nodes map to what they feed or read)."""
    wanted = set(names)
    nodes = list(model.graph.node)
    tensors = {t for n in nodes if n.name in wanted for t in list(n.input) + list(n.output)}
    originals = {n.name for n in nodes if n.name in wanted and n.op_type not in QUANT_OPS}
    originals |= {n.name for n in nodes if n.op_type not in QUANT_OPS and tensors & set(list(n.input) + list(n.output))}
    return originals
