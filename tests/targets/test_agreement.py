"""The analysis agrees node for node with the runtimes that can tell on this machine."""

from __future__ import annotations

import tempfile
from pathlib import Path

import onnx
import onnxruntime as ort
import openvino
import pytest
from onnxruntime.tools.mobile_helpers import usability_checker

import targets
from agent.modelcheck import load_model_checked
from tests.targets import graphs

MODELS = Path(__file__).resolve().parents[2].parent / "shared" / "models"
GENERATED = {
    "conv_chain": graphs.conv_chain,
    "conv_chain_dynamic": lambda: graphs.conv_chain(batch="N"),
    "unsupported_in_middle": graphs.unsupported_in_middle,
    "with_if": graphs.with_if,
    "tree_ensemble": graphs.tree_ensemble,
}
REAL = ["mnist8-modelzoo/mnist-8.onnx", "ultraface-rfb320/ultraface_RFB-320.onnx", "magika-standard_v3_3/model.onnx"]


def _model(key: str) -> onnx.ModelProto:
    if key in GENERATED:
        return GENERATED[key]()
    if not (MODELS / key).is_file():
        pytest.skip(f"{MODELS / key} absent (real models live in ../shared/models)")
    return load_model_checked(MODELS / key)


@pytest.mark.parametrize("key", list(GENERATED) + REAL)
def test_nnapi_matches_onnxruntime_checker(key: str) -> None:
    prepared = targets.prepare_model(_model(key))
    expected = usability_checker.check_nnapi_partitions(prepared, require_fixed_input_sizes=True)
    top = {n.name for n in prepared.graph.node}
    # ORT also partitions inside If/Loop bodies; the analysis places control-flow nodes whole
    groups = [g for g in expected.supported_groups if g[0].name in top]
    analysis = targets.analyse(prepared, targets.load_profile("nnapi"), min_partition_nodes=1, max_partitions=99)
    assert {n.name for n in analysis.nodes if n.accelerator} == {n.name for g in groups for n in g}
    assert analysis.accelerator_partitions == len(groups)


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
