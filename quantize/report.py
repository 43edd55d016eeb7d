"""The quantization report: JSON for machines, a rich table for people, HTML with a per-node error plot."""

from __future__ import annotations

import html
import inspect
import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import onnx
from rich.table import Table

from edgecore.durable import atomic_write
from quantize.budget import Budget
from quantize.choice import fp16_share
from quantize.openvino_ir import IrModel
from quantize.recipe import CpuFeatures
from quantize.reference import EvalSet, Rewrite
from quantize.variants import Variant

__all__ = ["QuantizeReport", "file_mode"]


@dataclass(frozen=True)
class QuantizeReport:
    """What was produced, how it measured against the float input, and why it was chosen."""

    data: dict[str, Any]
    errors: list[dict[str, Any]] = field(default_factory=list)
    model: onnx.ModelProto | None = None
    ir: IrModel | None = None  # written instead of `model` when the chosen variant is an OpenVINO IR

    @classmethod
    def build(cls, request: Any, target: str, cpu: CpuFeatures, variants: list[Variant], chosen: Variant,
              checks: dict[str, Any], latency: dict[str, Any], notes: list[str], evalset: EvalSet,
              rewrite: Rewrite | None, input_size: int, budget: Budget) -> QuantizeReport:
        """Assemble the report from the run's parts."""
        data = {
            "schema": 2,
            "model": str(request.model),
            "output": str(written_path(request.output, chosen.ir is not None)),
            "target": target,
            "mode": request.mode.value,
            "chosen": chosen.name,
            "chosen_format": describe_format(chosen),
            "host_cpu": {"x86": cpu.x86, "vnni": cpu.vnni},
            "calibration": {"method": request.method, "synthetic": request.calib_synthetic or None,
                            "dir": str(request.calib_dir) if request.calib_dir else None},
            "reference": {"model": str(request.model), "samples": evalset.source,
                          "rewrites": rewrite.to_dict() if rewrite is not None else None},
            "eval": evalset.source,
            "budget": budget.to_dict(),
            "max_drop": request.max_drop,
            "metrics": [{"output": m.output, "metric": m.title, "key": m.metric, "unit": m.unit, "why": m.why,
                         "axis": m.axis, "partner": m.partner, "role": m.role} for m in evalset.metrics],
            "input_size_bytes": input_size,
            "variants": [_variant(v, checks.get(v.name), latency.get(v.name, {}), input_size) for v in variants],
            "notes": notes,
        }
        return cls(data, [e.to_dict() for e in chosen.errors or _any_errors(variants)])

    def with_model(self, model: onnx.ModelProto, ir: IrModel | None = None) -> QuantizeReport:
        """The report carrying the model (or OpenVINO IR) to write."""
        return replace(self, model=model, ir=ir)

    def with_note(self, note: str) -> QuantizeReport:
        """The report with one more note."""
        return replace(self, data={**self.data, "notes": [*self.data["notes"], note]})

    def to_json(self) -> str:
        """The machine-readable report."""
        return json.dumps({**self.data, "per_tensor_error": self.errors}, indent=2, sort_keys=False)

    def table(self) -> Table:
        """One row per variant: size, latency ratios, accuracy, nodes kept float, target verdict."""
        table = Table(title=f"quantize {Path(self.data['model']).name} for {self.data['target']} "
                            f"(chosen: {self.data['chosen_format']})")
        for col in ("variant", "size", "ORT ms", "OV ms", "worst output vs your model", "budget", "float nodes",
                    "target"):
            table.add_column(col, justify="left" if col in ("variant", "target", "worst output vs your model")
                             else "right")
        for v in self.data["variants"]:
            mark = " *" if v["name"] == self.data["chosen"] else ""
            table.add_row(v["name"] + mark, f"{_size(v['size_bytes'])} {v['size_ratio']:.2f}x",
                          _ms(v, "ort_ms"), _ms(v, "openvino_ms"), _figure(v["accuracy"]), _share(v),
                          str(len(v["kept_float"])), _target(v))
        return table

    def html(self) -> str:
        """A standalone page: the JSON figures and an inline-SVG plot of per-tensor SQNR."""
        title = html.escape(f"edgectl quantize: {Path(self.data['model']).name} for {self.data['target']}")
        return (f"<!doctype html><meta charset=utf-8><title>{title}</title><h1>{title}</h1>"
                f"<h2>Per-tensor quantization error (SQNR, dB; lower is worse)</h2>{_svg(self.errors)}"
                f"<h2>Report</h2><pre>{html.escape(self.to_json())}</pre>")

    def write(self, output: Path, json_path: Path, html_path: Path | None) -> list[Path]:
        """Write the model (or the IR's two files), then the reports, each atomically; returns the model's files."""
        assert self.model is not None
        if self.ir is not None:
            xml = written_path(output, True)
            files = [self.ir.write(xml, _write), xml]
        else:
            _write(output, self.model.SerializeToString())
            files = [output]
        _write(json_path, self.to_json().encode())
        if html_path is not None:
            _write(html_path, self.html().encode())
        return files


def written_path(output: Path, ir: bool) -> Path:
    """Where the model goes: OUT itself, or OUT.xml (with OUT.bin beside it) for an OpenVINO IR."""
    return output.with_suffix(".xml") if ir else output


def describe_format(v: Variant) -> str:
    """The variant's format as users read it, with the real share of fp16 weights for fp16 variants."""
    if v.recipe.precision == "fp16":
        share = v.ir.fp16_share() if v.ir is not None else fp16_share(v.model)
        container = "OpenVINO IR, FP16-compressed weights" if v.ir is not None else "ONNX"
        return f"fp16 ({container}; {share:.0%} of weights float16)"
    if v.recipe.precision == "int8":
        return f"{v.name} ({'OpenVINO IR, NNCF' if v.ir is not None else 'QDQ ONNX'})"
    return {"fp32": "float (your model)", "dynamic": "dynamic int8 (ONNX)"}.get(v.recipe.precision, v.name)


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if "mode" in inspect.signature(atomic_write).parameters:  # a temp-file write: give it the umask's mode
        atomic_write(path, data, mode=file_mode())
    else:  # edgecore.durable without `mode` opens the file plainly, which already follows the umask
        atomic_write(path, data)


def file_mode() -> int:
    """The mode a plain `open()` would give a new file: 0666 less the process umask (0644 with umask 022)."""
    umask = os.umask(0o022)  # reading the umask means setting it; put it straight back
    os.umask(umask)
    return 0o666 & ~umask


def _variant(v: Variant, check: Any, latency: dict[str, Any], input_size: int) -> dict[str, Any]:
    size = v.size
    return {
        "name": v.name,
        "recipe": v.recipe.to_dict(),
        "format": describe_format(v),
        "problems": v.problems,
        "size_bytes": size,
        "size_ratio": round(size / max(input_size, 1), 4),
        "latency": latency,
        "accuracy": v.accuracy.to_dict(),
        "kept_float": v.kept_float,
        "accuracy_loop": v.history,
        "target_check": check.to_dict() if check is not None else None,
    }


def _any_errors(variants: list[Variant]) -> list[Any]:
    return next((v.errors for v in variants if v.errors), [])


def _size(size: int) -> str:
    return f"{size / 1e6:.1f}MB" if size >= 1e6 else f"{size / 1e3:.0f}kB"


def _figure(accuracy: dict[str, Any]) -> str:
    unit = " dB" if accuracy["unit"] == "dB" else ""
    drop = f" (drop {accuracy['drop']:.2f})" if accuracy["drop"] is not None else ""
    return (f"{accuracy['worst_output']}: {accuracy['metric']} {accuracy['value']:.2f}{unit}{drop}; worst sample "
            f"{accuracy['worst_sample']}: {accuracy['worst_sample_value']:.2f}{unit}")


def _share(v: dict[str, Any]) -> str:
    accuracy = v["accuracy"]
    return f"{accuracy['budget_share']:.2f}x {'ok' if accuracy['ok'] else 'OVER'}"


def _ms(v: dict[str, Any], key: str) -> str:
    value = v["latency"].get(key)
    return "-" if value is None else f"{value:.3f}"


def _target(v: dict[str, Any]) -> str:
    check = v["target_check"]
    if check is None:
        return "-"
    extra = "" if check["ok"] else f" (+{len(check['added_fallbacks'])} CPU)"
    return f"{check['after']['verdict']}{extra}"


def _svg(errors: list[dict[str, Any]]) -> str:
    if not errors:
        return "<p>No per-tensor errors (the accuracy loop did not run).</p>"
    width, height, pad = max(400, 14 * len(errors)), 260, 30
    top = max(max(e["xmodel_sqnr_db"], e["qdq_sqnr_db"]) for e in errors) or 1.0
    step = (width - 2 * pad) / max(len(errors), 1)
    bars, line = [], []
    for i, e in enumerate(errors):
        x = pad + i * step
        h = max(e["qdq_sqnr_db"], 0) / top * (height - 2 * pad)
        label = html.escape(f"{e['tensor']}: worst-channel {e['qdq_sqnr_db']} dB, vs float {e['xmodel_sqnr_db']} dB")
        bars.append(f'<rect x="{x:.1f}" y="{height - pad - h:.1f}" width="{step * 0.8:.1f}" height="{h:.1f}" '
                    f'fill="#4a90d9"><title>{label}</title></rect>')
        y = height - pad - max(e["xmodel_sqnr_db"], 0) / top * (height - 2 * pad)
        line.append(f"{x + step * 0.4:.1f},{y:.1f}")
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">'
            f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" stroke="black"/>'
            + "".join(bars) + f'<polyline points="{" ".join(line)}" fill="none" stroke="#d0021b"/>'
            f'<text x="{pad}" y="16">bars: worst-channel SQNR of the tensor; red: SQNR vs float model '
            f"(max {top:.0f} dB)</text></svg>")
