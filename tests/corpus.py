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
  optimizer fuses to ``SpaceToDepth`` before any execution provider sees the graph;
- ``upsample_opset9``: an opset-9 segmentation net with ``Upsample`` (onnx's converter turns it into a
  ``Resize`` with other coordinates unless told otherwise);
- ``regression_head``: one value per sample, ``[1, 1]`` (an age or a score);
- ``detector_background``: boxes ``[1,A,4]`` (corners) and softmax scores ``[1,A,2]``, most anchors background;
- ``landmarks``: ``[1, 10]`` face-landmark coordinates in [0, 1] from a Gemm (not class scores);
- ``image_to_image``: an enhancement net whose ``[1,3,H,W]`` output is an image in [0, 1];
- ``attention``: a self-attention block (MatMul, Softmax) with a context output and an ``[N, 1]`` score;
- ``lstm``: an LSTM over a sequence, then a Gemm head;
- ``already_quantized``: a QDQ model its author quantized (int8 weights, QuantizeLinear on activations);
- ``unloadable``: passes onnx's checker but onnxruntime refuses it (an intermediate declared int64).

``CorpusModel.shapes`` gives a static shape for each input (what a user would pass with
``--static-shape``); ``CorpusModel.feeds()`` makes matching random inputs. ``write_corpus(dir)``
saves them all and returns ``{name: path}``. ``LOADABLE`` is the corpus less the models onnxruntime
refuses on purpose (``CorpusModel.loads``), for tests that run every model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["CORPUS", "LOADABLE", "CorpusModel", "build", "write_corpus"]

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
           outputs: list[onnx.ValueInfoProto], inits: Sequence[onnx.TensorProto] = (), opset: int = OPSET,
           full_check: bool = True) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=IR_VERSION,
                              producer_name="edgectl tests/corpus.py")
    onnx.checker.check_model(model, full_check=full_check)
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


def upsample_opset9() -> onnx.ModelProto:
    """Opset 9: Conv/Relu, Upsample x2 (bilinear), then a 4-class Conv head: a small segmentation net."""
    nodes = _conv_block("e1", "x", "w1", "b1", "r1")
    nodes += [helper.make_node("Upsample", ["r1", "up_scales"], ["up"], name="upsample", mode="linear"),
              helper.make_node("Conv", ["up", "w2", "b2"], ["mask"], name="classes", pads=[1, 1, 1, 1])]
    inits = [_weight("w1", (8, 3, 3, 3), 141), _weight("b1", (8,), 142, 0.1), _weight("w2", (4, 8, 3, 3), 143),
             _weight("b2", (4,), 144, 0.1), numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "up_scales")]
    return _model("upsample_opset9", nodes, [_info("x", [1, 3, 16, 16])], [_info("mask", [1, 4, 32, 32])], inits,
                  opset=9)


def regression_head() -> onnx.ModelProto:
    """A CNN with one value per sample ([1, 1]): a cosine per sample would always say 1.0."""
    nodes = _conv_block("b1", "x", "w1", "b1", "r1") + _conv_block("b2", "r1", "w2", "b2", "r2")
    nodes += [helper.make_node("GlobalAveragePool", ["r2"], ["gap"], name="gap"),
              helper.make_node("Flatten", ["gap"], ["flat"], name="flatten"),
              helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["age"], name="fc", transB=1)]
    inits = [_weight("w1", (8, 3, 3, 3), 151), _weight("b1", (8,), 152, 0.1), _weight("w2", (8, 8, 3, 3), 153),
             _weight("b2", (8,), 154, 0.1), _weight("fc_w", (1, 8), 155, 1.0), numpy_helper.from_array(
                 np.array([0.1], np.float32), "fc_b")]
    return _model("regression_head", nodes, [_info("x", [1, 3, 16, 16])], [_info("age", [1, 1])], inits)


def detector_background() -> onnx.ModelProto:
    """Boxes [1,64,4] (x1,y1,x2,y2 around an 8x8 grid of anchors) and softmax scores [1,64,2], mostly background.

    The foreground logit follows the input's brightness at the anchor, so bright patches are confident faces.
    """
    nodes = _conv_block("s1", "x", "w1", "b1", "r1")
    nodes += [helper.make_node("MaxPool", ["r1"], ["feat"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
              helper.make_node("AveragePool", ["x"], ["bright"], name="brightness", kernel_shape=[2, 2], strides=[2, 2])]
    nodes += [helper.make_node("Concat", ["feat", "bright"], ["both"], name="stack", axis=1)]
    for head in ("box", "cls"):
        nodes += [helper.make_node("Conv", ["both", f"{head}_w", f"{head}_b"], [f"{head}_c"], name=f"{head}_conv"),
                  helper.make_node("Transpose", [f"{head}_c"], [f"{head}_t"], name=f"{head}_transpose", perm=[0, 2, 3, 1]),
                  helper.make_node("Reshape", [f"{head}_t", f"{head}_shape"], [f"{head}_r"], name=f"{head}_reshape")]
    nodes += [helper.make_node("Softmax", ["cls_r"], ["scores"], name="scores_softmax", axis=-1),
              helper.make_node("Sigmoid", ["box_r"], ["box_s"], name="box_sigmoid"),
              helper.make_node("Mul", ["box_s", "half_size"], ["offsets"], name="box_size"),
              helper.make_node("Add", ["anchors", "offsets"], ["boxes"], name="box_decode")]
    rng = np.random.default_rng(161)
    cls_w = (rng.standard_normal((2, 11, 1, 1)) * 0.05).astype(np.float32)
    cls_w[1, 8:, 0, 0] = 12.0  # the brightness channels drive the foreground logit
    grid = (np.stack(np.meshgrid(np.arange(8), np.arange(8), indexing="ij"), -1).reshape(-1, 2)[:, ::-1] + 0.5) / 8
    anchors = np.concatenate([grid, grid], axis=1)[None].astype(np.float32)
    inits = [_weight("w1", (8, 3, 3, 3), 162), _weight("b1", (8,), 163, 0.1), _weight("box_w", (4, 11, 1, 1), 164),
             _weight("box_b", (4,), 165, 0.1), numpy_helper.from_array(cls_w, "cls_w"),
             numpy_helper.from_array(np.array([0.0, -21.0], np.float32), "cls_b"),
             _ints("box_shape", [1, -1, 4]), _ints("cls_shape", [1, -1, 2]),
             numpy_helper.from_array(anchors, "anchors"),
             numpy_helper.from_array(np.array([-0.1, -0.1, 0.1, 0.1], np.float32), "half_size")]
    return _model("detector_background", nodes, [_info("x", [1, 3, 16, 16])],
                  [_info("boxes", [1, 64, 4]), _info("scores", [1, 64, 2])], inits)


def landmarks() -> onnx.ModelProto:
    """Five (x, y) face landmarks in [0, 1] from a Gemm and a Sigmoid: [1, 10] that are not class scores."""
    nodes = _conv_block("b1", "x", "w1", "b1", "r1")
    nodes += [helper.make_node("GlobalAveragePool", ["r1"], ["gap"], name="gap"),
              helper.make_node("Flatten", ["gap"], ["flat"], name="flatten"),
              helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["raw"], name="fc", transB=1),
              helper.make_node("Sigmoid", ["raw"], ["landmarks"], name="to_unit")]
    inits = [_weight("w1", (8, 3, 3, 3), 171), _weight("b1", (8,), 172, 0.1), _weight("fc_w", (10, 8), 173),
             _weight("fc_b", (10,), 174, 0.5)]
    return _model("landmarks", nodes, [_info("x", [1, 3, 16, 16])], [_info("landmarks", [1, 10])], inits)


def image_to_image() -> onnx.ModelProto:
    """Low-light enhancement: a residual Conv net whose output is the input image corrected, clipped to [0, 1]."""
    nodes = _conv_block("e1", "x", "w1", "b1", "r1")
    nodes += [helper.make_node("Conv", ["r1", "w2", "b2"], ["delta"], name="to_rgb", pads=[1, 1, 1, 1]),
              helper.make_node("Add", ["x", "delta"], ["sum"], name="residual"),
              helper.make_node("Clip", ["sum", "zero", "one"], ["enhanced"], name="clip")]
    inits = [_weight("w1", (8, 3, 3, 3), 181), _weight("b1", (8,), 182, 0.1), _weight("w2", (3, 8, 3, 3), 183, 0.05),
             _weight("b2", (3,), 184, 0.05), numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
             numpy_helper.from_array(np.array(1.0, np.float32), "one")]
    return _model("image_to_image", nodes, [_info("x", [1, 3, 16, 16])], [_info("enhanced", [1, 3, 16, 16])], inits)


def attention() -> onnx.ModelProto:
    """Single-head self-attention over [1, 8, 16] tokens: a context output and a pooled [1, 1] score."""
    nodes = [helper.make_node("MatMul", ["tokens", f"w{p}"], [p], name=f"proj_{p}") for p in ("q", "k", "v")]
    nodes += [helper.make_node("Transpose", ["k"], ["kt"], name="k_t", perm=[0, 2, 1]),
              helper.make_node("MatMul", ["q", "kt"], ["logits"], name="qk"),
              helper.make_node("Mul", ["logits", "inv_sqrt_d"], ["scaled"], name="scale"),
              helper.make_node("Softmax", ["scaled"], ["weights"], name="attend", axis=-1),
              helper.make_node("MatMul", ["weights", "v"], ["mixed"], name="mix"),
              helper.make_node("MatMul", ["mixed", "wo"], ["context"], name="out_proj"),
              helper.make_node("ReduceMean", ["context"], ["pooled"], name="pool", axes=[1], keepdims=0),
              helper.make_node("Gemm", ["pooled", "score_w", "score_b"], ["score"], name="score_head", transB=1)]
    inits = [_weight(f"w{p}", (16, 16), 190 + i, 0.25) for i, p in enumerate(("q", "k", "v", "o"))]
    inits += [numpy_helper.from_array(np.array(0.25, np.float32), "inv_sqrt_d"), _weight("score_w", (1, 16), 195),
              numpy_helper.from_array(np.array([0.5], np.float32), "score_b")]
    return _model("attention", nodes, [_info("tokens", [1, 8, 16])],
                  [_info("context", [1, 8, 16]), _info("score", [1, 1])], inits)


def lstm() -> onnx.ModelProto:
    """An LSTM (hidden 16) over a [6, 1, 8] sequence, its last hidden state through a Gemm head."""
    nodes = [helper.make_node("LSTM", ["seq", "W", "R", "B"], ["", "h_last"], name="lstm", hidden_size=16),
             helper.make_node("Reshape", ["h_last", "flat_shape"], ["h_flat"], name="flatten"),
             helper.make_node("Gemm", ["h_flat", "head_w", "head_b"], ["out"], name="head", transB=1)]
    inits = [_weight("W", (1, 64, 8), 201, 0.3), _weight("R", (1, 64, 16), 202, 0.3), _weight("B", (1, 128), 203, 0.1),
             _ints("flat_shape", [1, 16]), _weight("head_w", (4, 16), 204), _weight("head_b", (4,), 205, 0.1)]
    return _model("lstm", nodes, [_info("seq", [6, 1, 8])], [_info("out", [1, 4])], inits)


def already_quantized() -> onnx.ModelProto:
    """A QDQ classifier as its author exported it: int8 weights with their scales, activations through Q/DQ."""
    rng = np.random.default_rng(211)
    w = rng.integers(-127, 128, (8, 3, 3, 3)).astype(np.int8)
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zero"], ["x_q"], name="x_quant"),
             helper.make_node("DequantizeLinear", ["x_q", "x_scale", "x_zero"], ["x_dq"], name="x_dequant"),
             helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zero"], ["w"], name="w_dequant"),
             *_conv_block("b1", "x_dq", "w", "b1", "r1")]
    tail, tail_inits = _classifier_tail("r1", 8, 10, 212)
    inits = [numpy_helper.from_array(w, "w_q"), numpy_helper.from_array(np.array(0.003, np.float32), "w_scale"),
             numpy_helper.from_array(np.array(0, np.int8), "w_zero"), _weight("b1", (8,), 213, 0.1),
             numpy_helper.from_array(np.array(1 / 255, np.float32), "x_scale"),
             numpy_helper.from_array(np.array(0, np.uint8), "x_zero"), *tail_inits]
    return _model("already_quantized", nodes + tail, [_info("x", [1, 3, 16, 16])], [_info("logits", [1, 10])], inits)


def unloadable() -> onnx.ModelProto:
    """A CNN whose graph declares an intermediate tensor int64: onnx's checker passes it, onnxruntime refuses it."""
    nodes = _conv_block("b1", "x", "w1", "b1", "r1")
    tail, tail_inits = _classifier_tail("r1", 8, 10, 222)
    model = _model("unloadable", nodes + tail, [_info("x", [1, 3, 16, 16])], [_info("logits", [1, 10])],
                   [_weight("w1", (8, 3, 3, 3), 221), _weight("b1", (8,), 222, 0.1), *tail_inits], full_check=False)
    model.graph.value_info.append(_info("b1_c", [1, 8, 16, 16], TensorProto.INT64))
    onnx.checker.check_model(model)
    return model


@dataclass(frozen=True)
class CorpusModel:
    """One generated model, the trait it carries, and the static shapes a user would give it."""

    name: str
    trait: str
    make: Callable[[], onnx.ModelProto]
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    loads: bool = True  # False: onnxruntime refuses it on purpose (the trait is being refused)

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
    CorpusModel("upsample_opset9", "opset-9 Upsample (converted to Resize)", upsample_opset9, {"x": (1, 3, 16, 16)}),
    CorpusModel("regression_head", "[N, 1] regression head", regression_head, {"x": (1, 3, 16, 16)}),
    CorpusModel("detector_background", "detector, boxes + softmax scores, mostly background anchors",
                detector_background, {"x": (1, 3, 16, 16)}),
    CorpusModel("landmarks", "landmark regression [1, 10] from a Gemm", landmarks, {"x": (1, 3, 16, 16)}),
    CorpusModel("image_to_image", "image-to-image output [1, 3, H, W]", image_to_image, {"x": (1, 3, 16, 16)}),
    CorpusModel("attention", "self-attention block with an [N, 1] score", attention, {"tokens": (1, 8, 16)}),
    CorpusModel("lstm", "LSTM over a sequence, Gemm head", lstm, {"seq": (6, 1, 8)}),
    CorpusModel("already_quantized", "quantized by its author (QDQ)", already_quantized, {"x": (1, 3, 16, 16)}),
    CorpusModel("unloadable", "onnx's checker passes it, onnxruntime cannot load it", unloadable, {"x": (1, 3, 16, 16)},
                loads=False),
]}
LOADABLE: dict[str, CorpusModel] = {name: m for name, m in CORPUS.items() if m.loads}


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
