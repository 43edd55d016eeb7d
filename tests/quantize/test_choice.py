"""What rules a variant out before it is written, and what is written then: the float model under auto, else exit 5."""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, numpy_helper

from edgecore.errors import OperationFailed
from quantize.budget import Accuracy, Budget, OutputScore
from quantize.choice import choose, rule_out
from quantize.openvino_ir import IrModel, export_ir
from quantize.recipe import CpuFeatures, Family, recipe_for
from quantize.target_check import TargetCheck
from quantize.variants import Variant
from tests.quantize.models import tiny_cnn

CPU = CpuFeatures(frozenset({"sse2", "avx512_vnni"}))
OK = Accuracy((OutputScore("logits", "top1", "top-1 agreement", "points", 100.0, 100.0),), Budget())


def _variant(precision: str, model: onnx.ModelProto, family: Family = Family.NNAPI, **kw: object) -> Variant:
    return Variant(recipe_for(precision, family, CPU), model, OK, **kw)  # type: ignore[arg-type]


def _checks(*variants: Variant) -> dict[str, TargetCheck]:
    return {v.name: TargetCheck({}, {}) for v in variants}


def _unsorted() -> onnx.ModelProto:
    model = tiny_cnn()
    nodes = list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend(reversed(nodes))  # onnxruntime sorts it itself; onnx's full check refuses it
    return model


def test_a_file_onnx_refuses_is_not_written_auto_keeps_the_float_model(tmp_path: Path) -> None:
    float_, fp16 = _variant("fp32", tiny_cnn()), _variant("fp16", _unsorted())
    notes: list[str] = []
    chosen = choose([float_, fp16], False, True, {}, "ort_ms", _checks(float_, fp16), Family.NNAPI, "nnapi",
                    tmp_path / "o.onnx", notes)
    assert chosen.variant is float_ and chosen.failure is None
    assert any("fp16 ruled out: onnx.checker (full check) refuses it" in n and "topologically sorted" in n for n in notes)
    asked = choose([float_, fp16], False, False, {}, "ort_ms", _checks(float_, fp16), Family.NNAPI, "nnapi",
                   tmp_path / "o.onnx", [])
    assert isinstance(asked.failure, OperationFailed) and "fp16 cannot be written: onnx.checker" in str(asked.failure)


def test_fp16_is_only_fp16_when_the_weights_are() -> None:
    mostly_float = tiny_cnn()
    first = mostly_float.graph.initializer[0]  # w1: 216 of the 898 weight elements
    first.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(first).astype("float16"), first.name))
    assert first.data_type == TensorProto.FLOAT16
    variant = _variant("fp16", mostly_float, Family.COREML, kept_float=["conv2", "fc"])
    assert any("only 24% of its weights are float16 (2 nodes kept float32)" in p
               for p in rule_out(variant, Family.COREML, "coreml-mlprogram"))


def test_an_ir_newer_than_openvino_2022_3_is_ruled_out_for_myriad_only() -> None:
    ir = export_ir(tiny_cnn(), compress_to_fp16=True)
    newer = IrModel(ir.xml.replace(b'version="opset1"', b'version="opset11"', 1), ir.weights)
    assert not rule_out(_variant("fp16", tiny_cnn(), Family.OPENVINO, ir=ir), Family.OPENVINO, "myriad")
    problems = rule_out(_variant("fp16", tiny_cnn(), Family.OPENVINO, ir=newer), Family.OPENVINO, "myriad")
    assert problems and "opset11" in problems[0] and "OpenVINO 2022.3" in problems[0]
    assert not rule_out(_variant("fp16", tiny_cnn(), Family.OPENVINO, ir=newer), Family.OPENVINO, "intel-npu")


def test_a_variant_its_tool_cannot_build_leaves_the_float_model_under_auto(tmp_path: Path) -> None:
    """OpenVINO has no converter for ONNX-ML's Scaler, which onnxruntime runs: no IR, the float model for myriad."""
    import pytest
    from onnx import helper

    from edgecore.errors import ModelError
    from quantize import Mode, QuantizeRequest
    from quantize.pipeline import attempt_quantize

    model = tiny_cnn()
    model.opset_import.append(helper.make_opsetid("ai.onnx.ml", 3))
    model.graph.node[-1].output[0] = "raw"
    model.graph.node.append(helper.make_node("Scaler", ["raw"], ["logits"], domain="ai.onnx.ml", offset=[0.5] * 10,
                                             scale=[2.0] * 10))
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    request = QuantizeRequest(model=path, target="myriad", output=tmp_path / "o.onnx", measure=False)
    outcome = attempt_quantize(request)
    assert any(n.startswith("fp16 not built: OpenVINO") and "cannot convert" in n for n in outcome.report.data["notes"])
    # nor can OpenVINO load the float model: your own model is written, and the run says what that means there
    assert outcome.written and outcome.report.data["chosen"] == "float"
    assert any(n.startswith("WARNING: OpenVINO") and "cannot load it" in n and "(your model): on myriad" in n
               for n in outcome.report.data["notes"])
    with pytest.raises(ModelError, match=r"OpenVINO .* cannot convert the model"):
        attempt_quantize(QuantizeRequest(model=path, target="myriad", output=tmp_path / "o.onnx", mode=Mode.FP16,
                                         measure=False))
