"""Analysis of generated models: per-node providers, partitions, verdicts, shape fixing."""

from __future__ import annotations

import pytest

import targets
from edgecore.errors import ConfigError
from targets.shapes import fix_input_shapes, parse_static_shapes
from tests.targets import graphs


def test_all_supported_is_one_partition_yes() -> None:
    for name in ("nnapi", "jetson-orin", "qnn-htp", "myriad"):
        analysis = targets.analyse(graphs.conv_chain(opset=13), targets.load_profile(name))
        assert analysis.verdict == "YES", (name, analysis.reason)
        assert len(analysis.partitions) == 1 and analysis.accelerator_node_share == 1.0
    assert analysis.to_dict()["partitions"][0]["inputs"] == ["x"]


def test_unsupported_op_in_the_middle_makes_three_partitions() -> None:
    analysis = targets.analyse(graphs.unsupported_in_middle(), targets.load_profile("nnapi"))
    assert [p.provider for p in analysis.partitions] == [
        "NnapiExecutionProvider", "CPUExecutionProvider", "NnapiExecutionProvider"]
    # onnxruntime's basic optimizations fuse each MatMul+Add into a Gemm before NNAPI sees the graph
    assert [len(p.nodes) for p in analysis.partitions] == [3, 1, 3]
    assert "MatMulAddFusion" in analysis.nodes[0].name and analysis.nodes[0].op_type == "Gemm"
    erf = analysis.nodes[3]
    assert erf.provider == "CPUExecutionProvider" and "ai.onnx:Erf is not in NNAPI" in erf.reasons[0]
    assert analysis.partitions[1].inputs == ("h1",) and analysis.partitions[1].outputs == ("e",)
    assert analysis.verdict == "MAYBE" and analysis.accelerator_partitions == 2
    share = analysis.accelerator_flops_share
    assert share is not None and 0.8 < share <= 1.0


def test_small_partitions_fall_back_and_the_report_says_why() -> None:
    analysis = targets.analyse(graphs.unsupported_in_middle(), targets.load_profile("nnapi"), min_partition_nodes=5)
    assert [p.provider for p in analysis.partitions] == ["CPUExecutionProvider"]
    assert len(analysis.merges) == 2 and "fewer than 5 nodes" in analysis.merges[0]
    # the policy is a recommendation: deployed whole, onnxruntime still makes two NNAPI partitions
    assert analysis.policy.verdict == "NO" and analysis.policy.accelerator_partitions == 0
    assert analysis.verdict == "MAYBE" and analysis.runtime.accelerator_partitions == 2
    assert all(n.planned == "CPUExecutionProvider" for n in analysis.nodes)
    assert any("policy recommends 0" in a for a in analysis.advice)


def test_max_partitions_keeps_the_costliest() -> None:
    analysis = targets.analyse(graphs.unsupported_in_middle(), targets.load_profile("nnapi"), max_partitions=1)
    assert analysis.policy.accelerator_partitions == 1 and analysis.accelerator_partitions == 2
    assert "more than 1 accelerator partitions" in analysis.merges[0]
    assert analysis.nodes[0].planned == "NnapiExecutionProvider"  # mm1 (8x8) beats mm2 (8x4)
    assert analysis.nodes[4].planned == "CPUExecutionProvider"


def test_dynamic_input_blocks_static_shape_targets_until_fixed() -> None:
    model = graphs.conv_chain(batch="N")
    analysis = targets.analyse(model, targets.load_profile("nnapi"))
    assert analysis.verdict == "NO"
    assert all("dynamic shape" in n.reasons[0] for n in analysis.nodes)
    assert any("--static-shape x=1x3x8x8" in a for a in analysis.advice)
    assert targets.analyse(model, targets.load_profile("jetson-orin")).verdict == "YES"  # TensorRT profiles cope
    fixed = fix_input_shapes(model, parse_static_shapes(["x=1x3x8x8"]))
    assert targets.analyse(fixed, targets.load_profile("nnapi")).verdict == "YES"


def test_bad_static_shape_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="NAME=DIMS"):
        parse_static_shapes(["x=1xAx3"])
    with pytest.raises(ConfigError, match="no such input"):
        fix_input_shapes(graphs.conv_chain(batch="N"), {"nope": (1,)})


def test_control_flow_stays_on_cpu_for_qnn() -> None:
    analysis = targets.analyse(graphs.with_if(), targets.load_profile("qnn-htp"))
    node = {n.name: n for n in analysis.nodes}["if"]
    assert node.provider == "CPUExecutionProvider" and "If is not in" in node.reasons[0]
    cpu = targets.analyse(graphs.with_if(), targets.load_profile("cpu-x86"))
    assert cpu.verdict == "YES"


def test_onnx_ml_tree_runs_on_cpu_only() -> None:
    for name in ("nnapi", "jetson-orin", "qnn-htp", "myriad", "cpu-x86-openvino"):
        analysis = targets.analyse(graphs.tree_ensemble(), targets.load_profile(name))
        tree = analysis.nodes[1]
        assert tree.provider == "CPUExecutionProvider", name
        assert analysis.verdict == "NO", name
    assert targets.analyse(graphs.tree_ensemble(), targets.load_profile("cpu-arm")).verdict == "YES"


@pytest.mark.parametrize("opset", range(9, 22))
def test_opsets_9_to_21(opset: int) -> None:
    model = graphs.elementwise(opset)
    assert targets.analyse(model, targets.load_profile("cpu-x86")).verdict == "YES"
    nano = targets.analyse(model, targets.load_profile("jetson-nano"))  # TensorRT 8.4 table stops at opset 13
    tensorrt = nano.nodes[0].provider == "TensorrtExecutionProvider"
    assert tensorrt == (opset <= 13), nano.nodes[0].reasons
    if opset > 13:
        assert "newer than the 8.4 table's maximum 13" in nano.nodes[0].reasons[0]
        assert nano.nodes[0].provider == "CUDAExecutionProvider"


def test_static_shape_cannot_change_a_fixed_dim() -> None:
    with pytest.raises(ConfigError, match="--static-shape x"):
        fix_input_shapes(graphs.conv_chain(), {"x": (1, 3, 9, 9)})
