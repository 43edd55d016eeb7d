"""Generated models with the traits real exports have, one per trait, for tests across the project.

Each entry of ``CORPUS`` builds a small, checked ONNX model in code (no files in the repository):

- ``constant_weights``: every weight in a ``Constant`` node, as PaddlePaddle exports;
- ``dynamic_input``: fully dynamic ``[-1,3,-1,-1]`` input (``-1`` dim values, as Paddle writes them);
- ``detector``: shared backbone, two heads (``boxes`` [1,A,4] and ``scores`` [1,A,2] softmax);
- ``if_convs``: an ``If`` whose branches hold Conv/Relu (ops NNAPI and CoreML take);
- ``loop_convs``: a ``Loop`` whose body applies a Conv/Relu block a runtime number of times;
- ``nhwc``: NHWC input behind a Transpose, and an NHWC output, as TensorFlow exports;
- ``symbolic_batch``: a classifier with batch dim ``"N"``;
- ``focus``: YOLOv5's Focus block (four strided Slices and a Concat), which onnxruntime's basic
  optimizer fuses to ``SpaceToDepth`` before any execution provider sees the graph.

``CorpusModel.shapes`` gives a static shape for each input (what a user would pass with
``--static-shape``); ``CorpusModel.feeds()`` makes matching random inputs. ``write_corpus(dir)``
saves them all and returns ``{name: path}``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["CORPUS", "CorpusModel", "build", "write_corpus"]

IR_VERSION = 8  # accepted by onnxruntime and OpenVINO for every opset used here
OPSET = 17

Dim = int | str | None


def _weight(name: str, shape: tuple[int, ...], seed: int, scale: float = 0.3) -> onnx.TensorProto:
    rng = np.random.default_rng(seed)
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def _ints(name: str, values: Sequence[int]) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, np.int64), name)


def _info(name: str, dims: Sequence[Dim], dtype: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    info = helper.make_tensor_value_info(name, dtype, [d if d != -1 else None for d in dims])
    for dim, value in zip(info.type.tensor_type.shape.dim, dims, strict=True):
        if value == -1:  # helper cannot write -1; exporters do, and it must read as dynamic
            dim.dim_value = -1
    return info


def _model(name: str, nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto],
           outputs: list[onnx.ValueInfoProto], inits: Sequence[onnx.TensorProto] = ()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION,
                              producer_name="edgectl tests/corpus.py")
    onnx.checker.check_model(model, full_check=True)
    return model


def _conv_block(prefix: str, x: str, w: str, b: str, out: str) -> list[onnx.NodeProto]:
    return [helper.make_node("Conv", [x, w, b], [f"{prefix}_c"], name=f"{prefix}_conv", pads=[1, 1, 1, 1]),
            helper.make_node("Relu", [f"{prefix}_c"], [out], name=f"{prefix}_relu")]


def _classifier_tail(x: str, channels: int, classes: int, seed: int) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    nodes = [helper.make_node("GlobalAveragePool", [x], ["gap"], name="gap"),
             helper.make_node("Flatten", ["gap"], ["flat"], name="flatten"),
             helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], name="fc", transB=1)]
    return nodes, [_weight("fc_w", (classes, channels), seed), _weight("fc_b", (classes,), seed + 1, 0.1)]


def constant_weights() -> onnx.ModelProto:
    """Conv-Relu-Conv-Relu-GAP-Flatten-Gemm on [1,3,32,32] with every weight in a Constant node."""
    weights = [_weight("w1", (8, 3, 3, 3), 1), _weight("b1", (8,), 2, 0.1), _weight("w2", (8, 8, 3, 3), 3),
               _weight("b2", (8,), 4, 0.1), _weight("fc_w", (10, 8), 5), _weight("fc_b", (10,), 6, 0.1)]
    nodes = [helper.make_node("Constant", [], [w.name], name=f"const_{w.name}", value=w) for w in weights]
    nodes += _conv_block("b1", "x", "w1", "b1", "r1") + _conv_block("b2", "r1", "w2", "b2", "r2")
    tail, _ = _classifier_tail("r2", 8, 10, 5)
    return _model("constant_weights", nodes + tail, [_info("x", [1, 3, 32, 32])], [_info("logits", [1, 10])])


def dynamic_input() -> onnx.ModelProto:
    """A fully convolutional net on a [-1,3,-1,-1] input: every dim but channels unknown."""
    nodes = _conv_block("b1", "x", "w1", "b1", "r1") + _conv_block("b2", "r1", "w2", "b2", "r2")
    nodes.append(helper.make_node("Conv", ["r2", "w3"], ["y"], name="head"))
    inits = [_weight("w1", (8, 3, 3, 3), 11), _weight("b1", (8,), 12, 0.1), _weight("w2", (8, 8, 3, 3), 13),
             _weight("b2", (8,), 14, 0.1), _weight("w3", (2, 8, 1, 1), 15)]
    return _model("dynamic_input", nodes, [_info("x", [-1, 3, -1, -1])], [_info("y", [-1, 2, -1, -1])], inits)


def detector() -> onnx.ModelProto:
    """Backbone, then a box head ([1,A,4]) and a score head ([1,A,2] softmax), A = 2*8*8 anchors."""
    nodes = _conv_block("s1", "x", "w1", "b1", "r1")
    nodes += [helper.make_node("MaxPool", ["r1"], ["p1"], name="pool", kernel_shape=[2, 2], strides=[2, 2])]
    nodes += _conv_block("s2", "p1", "w2", "b2", "feat")
    for head in ("boxes", "scores"):
        nodes += [
            helper.make_node("Conv", ["feat", f"{head}_w", f"{head}_b"], [f"{head}_c"], name=f"{head}_conv"),
            helper.make_node("Transpose", [f"{head}_c"], [f"{head}_t"], name=f"{head}_transpose", perm=[0, 2, 3, 1]),
            helper.make_node("Reshape", [f"{head}_t", f"{head}_shape"],
                             [head if head == "boxes" else "scores_raw"], name=f"{head}_reshape"),
        ]
    nodes.append(helper.make_node("Softmax", ["scores_raw"], ["scores"], name="scores_softmax", axis=-1))
    inits = [_weight("w1", (8, 3, 3, 3), 21), _weight("b1", (8,), 22, 0.1), _weight("w2", (16, 8, 3, 3), 23),
             _weight("b2", (16,), 24, 0.1), _weight("boxes_w", (8, 16, 1, 1), 31), _weight("boxes_b", (8,), 32, 0.1),
             _weight("scores_w", (4, 16, 1, 1), 41), _weight("scores_b", (4,), 42, 0.1),
             _ints("boxes_shape", [1, -1, 4]), _ints("scores_shape", [1, -1, 2])]
    return _model("detector", nodes, [_info("x", [1, 3, 16, 16])],
                  [_info("boxes", [1, 128, 4]), _info("scores", [1, 128, 2])], inits)


def _branch(name: str, prefix: str, seed: int) -> onnx.GraphProto:
    nodes = _conv_block(f"{prefix}1", "stem", f"{prefix}_w1", f"{prefix}_b1", f"{prefix}_r1")
    nodes += _conv_block(f"{prefix}2", f"{prefix}_r1", f"{prefix}_w2", f"{prefix}_b2", f"{prefix}_out")
    inits = [_weight(f"{prefix}_w1", (8, 8, 3, 3), seed), _weight(f"{prefix}_b1", (8,), seed + 1, 0.1),
             _weight(f"{prefix}_w2", (8, 8, 3, 3), seed + 2), _weight(f"{prefix}_b2", (8,), seed + 3, 0.1)]
    return helper.make_graph(nodes, name, [], [_info(f"{prefix}_out", [1, 8, 16, 16])], inits)


def if_convs() -> onnx.ModelProto:
    """Stem conv, then an If whose branches are two Conv/Relu blocks each (reading the stem from outside)."""
    nodes = _conv_block("stem", "x", "stem_w", "stem_b", "stem")
    nodes.append(helper.make_node("If", ["use_a"], ["branch"], name="if",
                                  then_branch=_branch("then", "ta", 50), else_branch=_branch("else", "eb", 60)))
    tail, tail_inits = _classifier_tail("branch", 8, 10, 70)
    inits = [_weight("stem_w", (8, 3, 3, 3), 51), _weight("stem_b", (8,), 52, 0.1), *tail_inits]
    return _model("if_convs", nodes + tail, [_info("x", [1, 3, 16, 16]), _info("use_a", [], TensorProto.BOOL)],
                  [_info("logits", [1, 10])], inits)


def loop_convs() -> onnx.ModelProto:
    """A Loop that applies Conv/Relu/Conv/Add (a residual block) ``steps`` times to the stem output."""
    body_nodes = _conv_block("lb1", "state_in", "loop_w1", "loop_b1", "lb_r1")
    body_nodes += [helper.make_node("Conv", ["lb_r1", "loop_w2"], ["lb_c2"], name="lb2_conv", pads=[1, 1, 1, 1]),
                   helper.make_node("Add", ["lb_c2", "state_in"], ["state_out"], name="lb_add"),
                   helper.make_node("Identity", ["cond_in"], ["cond_out"], name="lb_cond")]
    body = helper.make_graph(
        body_nodes, "loop_body",
        [_info("iter", [], TensorProto.INT64), _info("cond_in", [], TensorProto.BOOL), _info("state_in", [1, 8, 16, 16])],
        [_info("cond_out", [], TensorProto.BOOL), _info("state_out", [1, 8, 16, 16])],
        [_weight("loop_w1", (8, 8, 3, 3), 81, 0.1), _weight("loop_b1", (8,), 82, 0.1),
         _weight("loop_w2", (8, 8, 3, 3), 83, 0.1)])
    nodes = _conv_block("stem", "x", "stem_w", "stem_b", "stem")
    nodes.append(helper.make_node("Loop", ["steps", "keep_going", "stem"], ["looped"], name="loop", body=body))
    tail, tail_inits = _classifier_tail("looped", 8, 10, 90)
    inits = [_weight("stem_w", (8, 3, 3, 3), 91), _weight("stem_b", (8,), 92, 0.1),
             numpy_helper.from_array(np.array(True), "keep_going"), *tail_inits]
    return _model("loop_convs", nodes + tail, [_info("x", [1, 3, 16, 16]), _info("steps", [], TensorProto.INT64)],
                  [_info("logits", [1, 10])], inits)


def nhwc() -> onnx.ModelProto:
    """TensorFlow-style segmentation: NHWC input, Transpose to NCHW, convs, Transpose back, softmax."""
    nodes = [helper.make_node("Transpose", ["image"], ["nchw"], name="to_nchw", perm=[0, 3, 1, 2])]
    nodes += _conv_block("e1", "nchw", "w1", "b1", "r1") + _conv_block("e2", "r1", "w2", "b2", "r2")
    nodes += [helper.make_node("Conv", ["r2", "w3", "b3"], ["logits_nchw"], name="classes"),
              helper.make_node("Transpose", ["logits_nchw"], ["logits_nhwc"], name="to_nhwc", perm=[0, 2, 3, 1]),
              helper.make_node("Softmax", ["logits_nhwc"], ["mask"], name="softmax", axis=-1)]
    inits = [_weight("w1", (8, 3, 3, 3), 101), _weight("b1", (8,), 102, 0.1), _weight("w2", (8, 8, 3, 3), 103),
             _weight("b2", (8,), 104, 0.1), _weight("w3", (4, 8, 1, 1), 105), _weight("b3", (4,), 106, 0.1)]
    return _model("nhwc", nodes, [_info("image", [1, 32, 48, 3])], [_info("mask", [1, 32, 48, 4])], inits)


def symbolic_batch() -> onnx.ModelProto:
    """A classifier whose batch dim is the symbol "N"."""
    nodes = _conv_block("b1", "x", "w1", "b1", "r1")
    tail, tail_inits = _classifier_tail("r1", 8, 10, 120)
    inits = [_weight("w1", (8, 3, 3, 3), 111), _weight("b1", (8,), 112, 0.1), *tail_inits]
    return _model("symbolic_batch", nodes + tail, [_info("x", ["N", 3, 16, 16])], [_info("logits", ["N", 10])], inits)


def focus() -> onnx.ModelProto:
    """YOLOv5's Focus: four stride-2 Slices of the image concatenated on channels, then Conv/Sigmoid/Mul."""
    nodes = [helper.make_node("Slice", ["x", f"start{i}", "end", "axes", "step"], [f"slice{i}"], name=f"focus_slice{i}")
             for i in range(4)]
    nodes += [helper.make_node("Concat", ["slice0", "slice2", "slice1", "slice3"], ["cat"], name="focus_concat", axis=1),
              helper.make_node("Conv", ["cat", "w1", "b1"], ["c1"], name="focus_conv", pads=[1, 1, 1, 1]),
              helper.make_node("Sigmoid", ["c1"], ["s1"], name="silu_sigmoid"),
              helper.make_node("Mul", ["c1", "s1"], ["y"], name="silu_mul")]
    big = 2**31 - 1
    inits = [_ints("start0", [0, 0]), _ints("start1", [0, 1]), _ints("start2", [1, 0]), _ints("start3", [1, 1]),
             _ints("end", [big, big]), _ints("axes", [2, 3]), _ints("step", [2, 2]),
             _weight("w1", (16, 12, 3, 3), 131), _weight("b1", (16,), 132, 0.1)]
    return _model("focus", nodes, [_info("x", [1, 3, 32, 32])], [_info("y", [1, 16, 16, 16])], inits)


@dataclass(frozen=True)
class CorpusModel:
    """One generated model, the trait it carries, and the static shapes a user would give it."""

    name: str
    trait: str
    make: Callable[[], onnx.ModelProto]
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def feeds(self, seed: int = 0) -> dict[str, np.ndarray]:
        """Random inputs of ``shapes`` (floats in [0, 1), bools True, int64 loop counts 2)."""
        rng = np.random.default_rng(seed)
        model = self.make()
        out: dict[str, np.ndarray] = {}
        for info in model.graph.input:
            elem = info.type.tensor_type.elem_type
            shape = self.shapes[info.name]
            if elem == TensorProto.BOOL:
                out[info.name] = np.ones(shape, np.bool_)
            elif elem == TensorProto.INT64:
                out[info.name] = np.full(shape, 2, np.int64)
            else:
                out[info.name] = rng.random(shape, dtype=np.float32)
        return out

    def static_shape_args(self) -> list[str]:
        """``--static-shape`` values for the inputs with a rank, e.g. ``["x=1x3x32x32"]``."""
        return [f"{k}={'x'.join(map(str, v))}" for k, v in self.shapes.items() if v]


CORPUS: dict[str, CorpusModel] = {m.name: m for m in [
    CorpusModel("constant_weights", "weights in Constant nodes (PaddlePaddle export)", constant_weights,
                {"x": (1, 3, 32, 32)}),
    CorpusModel("dynamic_input", "fully dynamic input [-1,3,-1,-1]", dynamic_input, {"x": (1, 3, 32, 32)}),
    CorpusModel("detector", "multi-output detector (boxes and scores heads)", detector, {"x": (1, 3, 16, 16)}),
    CorpusModel("if_convs", "If subgraphs containing convs", if_convs, {"x": (1, 3, 16, 16), "use_a": ()}),
    CorpusModel("loop_convs", "Loop subgraph containing convs", loop_convs, {"x": (1, 3, 16, 16), "steps": ()}),
    CorpusModel("nhwc", "NHWC input behind a Transpose (TensorFlow export)", nhwc, {"image": (1, 32, 48, 3)}),
    CorpusModel("symbolic_batch", "symbolic batch dim 'N'", symbolic_batch, {"x": (1, 3, 16, 16)}),
    CorpusModel("focus", "Focus block that onnxruntime fuses to SpaceToDepth", focus, {"x": (1, 3, 32, 32)}),
]}


def build(name: str) -> onnx.ModelProto:
    """The model called ``name``; KeyError lists the known names."""
    if name not in CORPUS:
        raise KeyError(f"no corpus model {name!r}; known: {', '.join(CORPUS)}")
    return CORPUS[name].make()


def write_corpus(directory: Path, names: Sequence[str] | None = None) -> dict[str, Path]:
    """Save the corpus (or ``names`` from it) as ``directory/NAME.onnx``; returns ``{name: path}``."""
    directory.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    for name in names or list(CORPUS):
        paths[name] = directory / f"{name}.onnx"
        onnx.save(build(name), str(paths[name]))
    return paths
