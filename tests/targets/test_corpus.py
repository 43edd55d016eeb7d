"""The generated corpus (tests/corpus.py) through analysis, `inspect` and `partition`: traits real exports have."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

import targets
from edgecore.partitions import PartitionedRunner, load_plan
from targets.shapes import fix_input_shapes, static_shape_hint
from tests.corpus import CORPUS, LOADABLE, build, write_corpus

ROOT = Path(__file__).resolve().parents[2]
STATIC_ONLY = ["myriad", "intel-npu", "qnn-htp", "nnapi", "coreml-mlprogram", "coreml-neuralnetwork"]


def edgectl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edgectl.cli.main", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.mark.parametrize("name", ["dynamic_input", "symbolic_batch"])
@pytest.mark.parametrize("target", STATIC_ONLY)
def test_dynamic_models_are_not_yes_on_static_shape_targets(name: str, target: str) -> None:
    analysis = targets.analyse(build(name), targets.load_profile(target))
    assert analysis.verdict == "NO", analysis.reason
    hint = "--static-shape x=1x3xHxW" if name == "dynamic_input" else "--static-shape x=1x3x16x16"
    assert any(hint in a for a in analysis.advice), analysis.advice
    assert not any("inputs are static" in a for a in analysis.advice)
    fixed = targets.analyse(fix_input_shapes(build(name), CORPUS[name].shapes), targets.load_profile(target))
    assert not any("dynamic shape" in r for n in fixed.nodes for r in n.reasons)
    # Myriad's table stops at opset 16; MLProgram's op list has no Flatten (symbolic_batch's classifier tail)
    expected = "NO" if target == "myriad" else "MAYBE" if (target, name) == ("coreml-mlprogram", "symbolic_batch") else "YES"
    assert fixed.verdict == expected, fixed.reason


def test_flops_are_unknown_on_dynamic_dims_never_negative() -> None:
    analysis = targets.analyse(build("dynamic_input"), targets.load_profile("jetson-orin"))
    assert analysis.accelerator_flops_share is None and "FLOPs unknown" in analysis.reason
    assert all(n.flops is None for n in analysis.nodes if n.op_type == "Conv")
    assert analysis.to_dict()["accelerator_flops_share"] is None
    fixed = targets.analyse(fix_input_shapes(build("dynamic_input"), {"x": (1, 3, 32, 32)}),
                            targets.load_profile("jetson-orin"))
    assert fixed.accelerator_flops_share == 1.0 and all(n.flops is not None and n.flops > 0 for n in fixed.nodes)


def test_focus_block_is_analysed_as_the_space_to_depth_ort_fuses_it_into() -> None:
    analysis = targets.analyse(build("focus"), targets.load_profile("nnapi"))
    ops = [n.op_type for n in analysis.nodes]
    assert "SpaceToDepth" in ops and "Slice" not in ops, ops
    s2d = next(n for n in analysis.nodes if n.op_type == "SpaceToDepth")
    assert "onnxruntime" in analysis.graph_note and "basic optimizations" in analysis.graph_note
    # NNAPI takes Slice and Concat but not SpaceToDepth: analysing the graph as exported would say 1 of 1
    assert s2d.provider == "CPUExecutionProvider" and "SpaceToDepth is not in NNAPI" in s2d.reasons[0]
    assert analysis.runtime.accelerator_nodes == len(analysis.nodes) - 1


def test_partitions_inside_if_branches_are_reported_as_the_runtime_makes_them() -> None:
    analysis = targets.analyse(build("if_convs"), targets.load_profile("nnapi"))
    bodies = [p for p in analysis.runtime_partitions if p.graph != "main" and p.accelerator]
    assert {p.graph for p in bodies} == {"if/then_branch", "if/else_branch"}
    assert analysis.runtime.accelerator_partitions == 4 and analysis.verdict == "NO"
    # the pieces `edgectl partition` writes run the If on the CPU, bodies included
    assert analysis.policy.accelerator_partitions == 1  # the 2-node stem is below min_partition_nodes 3
    assert all(n.planned == "CPUExecutionProvider" for n in analysis.nodes if n.graph != "main")
    tensorrt = targets.analyse(build("if_convs"), targets.load_profile("jetson-orin"))
    assert tensorrt.verdict == "YES" and not [p for p in tensorrt.runtime_partitions if p.graph != "main"]


def test_inspect_all_covers_every_corpus_model_and_new_target(corpus_dir: dict[str, Path], tmp_path: Path) -> None:
    result = edgectl("inspect", str(corpus_dir["detector"]), "--target", "all", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert {"coreml-mlprogram", "coreml-neuralnetwork", "edgetpu", "nnapi"} <= {a["target"] for a in json.loads(result.stdout)}
    profiles = targets.list_profiles()  # every model in process: what the command runs, without 19 interpreters
    for name, path in corpus_dir.items():
        verdicts = {p.name: targets.analyse(onnx.load(str(path)), p).to_dict() for p in profiles}
        assert verdicts["edgetpu"]["verdict"] == "NO", name
        for analysis in verdicts.values():
            assert analysis["accelerator_flops_share"] is None or 0 <= analysis["accelerator_flops_share"] <= 1


def test_edgetpu_answers_no_with_the_conversion_path(corpus_dir: dict[str, Path], tmp_path: Path) -> None:
    no = edgectl("inspect", str(corpus_dir["detector"]), "--target", "edgetpu", cwd=tmp_path)
    nnapi_no = edgectl("inspect", str(corpus_dir["dynamic_input"]), "--target", "nnapi", cwd=tmp_path)
    assert no.returncode == nnapi_no.returncode == 0, no.stderr  # a NO verdict is an answer, not an error
    assert "edgetpu: NO" in no.stdout and "nnapi: NO" in nnapi_no.stdout
    for text in ("TensorFlow Lite", "edgetpu_compiler", "onnx2tf", "representative_dataset", "integer"):
        assert text in no.stdout, text
    shown = edgectl("targets", "show", "edgetpu", cwd=tmp_path)
    assert shown.returncode == 0 and "NO" in shown.stdout and "onnx2tf" in shown.stdout
    refused = edgectl("partition", str(corpus_dir["detector"]), "-t", "edgetpu", "-o", str(tmp_path / "o"), cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr.startswith("error: cannot partition for edgetpu")
    assert not (tmp_path / "o").exists()


def test_partition_refuses_dynamic_shapes_with_the_flag_then_fixes_them(corpus_dir: dict[str, Path],
                                                                         tmp_path: Path) -> None:
    out = tmp_path / "parts"
    refused = edgectl("partition", str(corpus_dir["dynamic_input"]), "-t", "nnapi", "-o", str(out), cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "input 'x' is unk__x_0x3xunk__x_2xunk__x_3" not in refused.stderr
    assert "--static-shape x=1x3xHxW" in refused.stderr and not out.exists()
    fixed = edgectl("partition", str(corpus_dir["dynamic_input"]), "-t", "nnapi", "-o", str(out),
                    "--static-shape", "x=1x3x32x32", cwd=tmp_path)
    assert fixed.returncode == 0, fixed.stderr
    _runs_like_the_original("dynamic_input", out)


@pytest.mark.parametrize("name", list(LOADABLE))
def test_every_corpus_model_partitions_into_pieces_that_reproduce_it(name: str, tmp_path: Path) -> None:
    model = fix_input_shapes(build(name), {k: v for k, v in CORPUS[name].shapes.items() if v})
    profile = targets.load_profile("nnapi")
    from targets.partitioner import write_partitions

    write_partitions(model, targets.analyse(model, profile, min_partition_nodes=1), tmp_path)
    _runs_like_the_original(name, tmp_path)


def _runs_like_the_original(name: str, plan_dir: Path) -> None:
    import onnxruntime as ort

    feeds = CORPUS[name].feeds()
    expected = ort.InferenceSession(build(name).SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    outputs = [o.name for o in build(name).graph.output]
    for piece in json.loads((plan_dir / "partitions.json").read_text())["pieces"]:
        onnx.checker.check_model(onnx.load(str(plan_dir / piece["file"])))
    with PartitionedRunner(load_plan(plan_dir), available=["CPUExecutionProvider"]) as runner:
        got = runner.run(feeds)
    for out, want in zip(outputs, expected, strict=True):
        np.testing.assert_allclose(got[out], want, rtol=1e-4, atol=1e-5)


def test_a_model_onnxruntime_cannot_load_is_never_yes_and_never_partitioned(corpus_dir: dict[str, Path],
                                                                            tmp_path: Path) -> None:
    analysis = targets.analyse(build("unloadable"), targets.load_profile("cpu-x86"))
    assert not analysis.loads and analysis.verdict == analysis.policy.verdict == "NO"
    assert "cannot load the model" in analysis.reason and "Type Error" in analysis.reason
    shown = edgectl("inspect", str(corpus_dir["unloadable"]), "-t", "cpu-x86", "--json", cwd=tmp_path)
    assert shown.returncode == 0 and json.loads(shown.stdout)["verdict"] == "NO"
    out = tmp_path / "parts"
    refused = edgectl("partition", str(corpus_dir["unloadable"]), "-t", "cpu-x86", "-o", str(out), cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "onnxruntime cannot load it" in refused.stderr and not out.exists()


SILERO_V5 = ROOT.parent / "shared" / "models" / "silero-vad" / "silero_vad.onnx"


@pytest.mark.skipif(not SILERO_V5.exists(), reason=f"{SILERO_V5} not present (shared models not mounted)")
def test_a_static_shape_onnxruntime_cannot_load_is_refused_naming_the_flag(tmp_path: Path) -> None:
    """silero-vad v5 at 1x576: its untaken 8 kHz branch cannot take the shape (onnx's own inference passes it)."""
    for command in (["inspect"], ["partition", "-o", str(tmp_path / "parts")]):
        result = edgectl(*command[:1], str(SILERO_V5), "-t", "cpu-x86", "--static-shape", "input=1x576", *command[1:],
                         cwd=tmp_path)
        assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
        assert "--static-shape input=1x576: onnxruntime cannot load the model at these shapes" in result.stderr
    assert not (tmp_path / "parts").exists()


def test_suggested_shapes_never_reuse_a_letter_for_two_dimensions() -> None:
    from onnx import TensorProto, helper

    inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, [None, 3, None, None]),
              helper.make_tensor_value_info("b", TensorProto.FLOAT, [None, 1, None, None]),
              helper.make_tensor_value_info("ids", TensorProto.FLOAT, [None, "seq"]),
              helper.make_tensor_value_info("mask", TensorProto.FLOAT, [None, "seq"])]
    nodes = [helper.make_node("Identity", [i.name], [f"{i.name}_out"]) for i in inputs]
    graph = helper.make_graph(nodes, "two_images", inputs,
                              [helper.make_tensor_value_info(f"{i.name}_out", TensorProto.FLOAT, None) for i in inputs])
    hint = static_shape_hint(helper.make_model(graph))
    assert hint == ("--static-shape a=1x3xHxW --static-shape b=1x1xH2xW2 --static-shape ids=1xseq "
                    "--static-shape mask=1xseq")  # one dim_param is one dimension: the same letter
