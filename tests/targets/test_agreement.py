"""The analysis agrees with the runtimes and tools that can tell on this machine."""

from __future__ import annotations

import tempfile
from pathlib import Path

import onnx
import onnxruntime as ort
import openvino
import pytest
from onnxruntime.tools.mobile_helpers import usability_checker
from onnxruntime.tools.onnx_model_utils import ModelProtoWithShapeInfo, optimize_model

import targets
from edgecore.modelcheck import load_model_checked
from tests.corpus import LOADABLE
from tests.targets import graphs

MODELS = Path(__file__).resolve().parents[2].parent / "shared" / "models"
GENERATED = {
    "conv_chain": graphs.conv_chain,
    "conv_chain_dynamic": lambda: graphs.conv_chain(batch="N"),
    "unsupported_in_middle": graphs.unsupported_in_middle,
    "with_if": graphs.with_if,
    "tree_ensemble": graphs.tree_ensemble,
    **{f"corpus:{name}": entry.make for name, entry in LOADABLE.items()},
}
REAL = ["mnist8-modelzoo/mnist-8.onnx", "ultraface-rfb320/ultraface_RFB-320.onnx", "magika-standard_v3_3/model.onnx"]
# every model in ../shared/models, found when the tests are collected (none: one skipped case says so)
SHARED = sorted(str(p.relative_to(MODELS)) for p in MODELS.glob("*/*.onnx")) or ["(../shared/models absent)"]
CHECKER = {
    "nnapi": lambda m: usability_checker.check_nnapi_partitions(m, True),
    "coreml-neuralnetwork": lambda m: usability_checker.check_coreml_partitions(
        m, True, "coreml_supported_neuralnetwork_ops.md"),
    "coreml-mlprogram": lambda m: usability_checker.check_coreml_partitions(m, True, "coreml_supported_mlprogram_ops.md"),
}


def _model(key: str) -> onnx.ModelProto:
    if key in GENERATED:
        return GENERATED[key]()
    if not (MODELS / key).is_file():
        pytest.skip(f"{MODELS / key} absent (real models live in ../shared/models)")
    return load_model_checked(MODELS / key)


def _checker_own_path(model: onnx.ModelProto, target: str, tmp: Path) -> tuple[int, int, int, str]:
    """ORT's usability checker exactly as `python -m onnxruntime.tools.check_onnx_model_mobile_usability` runs it."""
    source, optimized = tmp / "model.onnx", tmp / "optimized.onnx"
    onnx.save(model, str(source))
    optimize_model(source, optimized, use_external_initializers=True)
    try:
        with_shapes = ModelProtoWithShapeInfo(optimized).model_with_shape_info
    except onnx.shape_inference.InferenceError as exc:
        pytest.skip(f"onnxruntime's checker itself cannot analyse this model: {str(exc).splitlines()[0][:120]}")
    info = CHECKER[target](with_shapes)
    return info.num_partitions, info.num_supported_nodes, info.num_nodes, info.suitability().name


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # ORT helper's __del__
@pytest.mark.parametrize("target", list(CHECKER))
@pytest.mark.parametrize("key", list(GENERATED) + SHARED)
def test_ort_mobile_targets_match_onnxruntime_checker(key: str, target: str, tmp_path: Path) -> None:
    if key.startswith("("):
        pytest.skip(f"{MODELS} absent: no shared models to compare")
    model = _model(key)
    expected = _checker_own_path(model, target, tmp_path)
    analysis = targets.analyse(model, targets.load_profile(target))
    runtime = analysis.runtime
    got = (runtime.accelerator_partitions, runtime.accelerator_nodes, runtime.nodes, runtime.verdict)
    assert got == expected


@pytest.mark.parametrize("key", ["conv_chain", "unsupported_in_middle", "tree_ensemble", *REAL])
def test_openvino_cpu_matches_query_model(key: str) -> None:
    prepared = targets.prepare_model(_model(key))
    core = openvino.Core()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.onnx"
        onnx.save(prepared, str(path))
        try:
            placed = set(core.query_model(core.read_model(str(path)), "CPU"))
        except RuntimeError:  # the frontend cannot convert everything: then nothing is placed whole
            placed = set()
    analysis = targets.analyse(prepared, targets.load_profile("cpu-x86-openvino"), min_partition_nodes=1,
                               max_partitions=99)
    outputs = {n.name: set(n.output) for n in prepared.graph.node}
    for node in analysis.nodes:
        # OpenVINO names an op after the ONNX node or after its output tensor
        expected = node.name in placed or bool(outputs[node.name] & placed)
        if node.op_type != "Identity":  # folded by OpenVINO; the analysis counts it as placed
            assert node.accelerator == expected or not placed, node


@pytest.mark.parametrize("key", list(GENERATED) + REAL)
def test_cpu_matches_ort_graph_assignment(key: str) -> None:
    prepared = targets.prepare_model(_model(key))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    session = ort.InferenceSession(prepared.SerializeToString(), options, providers=["CPUExecutionProvider"])
    assigned = {n.name: sub.ep_name for sub in session.get_provider_graph_assignment_info() for n in sub.get_nodes()}
    analysis = targets.analyse(prepared, targets.load_profile("cpu-x86"))
    for node in analysis.nodes:
        assert assigned[node.name] == node.provider == "CPUExecutionProvider"
