"""Models and samples for ./scripts/bench quantize: generated here, trained here, or from ../shared/models.

- ``mobilenet_v2``: MobileNetV2 (width 1.0, BN folded) with He-initialised random weights;
- ``detector_400``: a YOLO-style detector of about 400 nodes with three output heads;
- ``digits_mlp``: an MLP trained here on scikit-learn's digits;
- ``mnist_digits`` / ``ultraface``: samples for the shared mnist-8 and ultraface models.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["MODELS", "detector_400", "digits_mlp", "mnist_digits", "mobilenet_v2", "ultraface", "write_samples"]

MODELS = Path(__file__).resolve().parents[2] / "shared" / "models"


def _conv(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], rng: np.random.Generator, x: str, cin: int,
          cout: int, k: int, s: int, group: int = 1, act: bool = True) -> str:
    name = f"conv{len(nodes)}"
    fan_in = cin // group * k * k
    weight = rng.normal(0, np.sqrt(2.0 / fan_in), (cout, cin // group, k, k)).astype(np.float32)
    inits += [numpy_helper.from_array(weight, f"{name}_w"),
              numpy_helper.from_array(rng.normal(0, 0.05, cout).astype(np.float32), f"{name}_b")]
    nodes.append(helper.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [name], name, kernel_shape=[k, k],
                                  strides=[s, s], pads=[k // 2] * 4, group=group))
    if not act:
        return name
    nodes.append(helper.make_node("Clip", [name, "zero", "six"], [name + "_r"], name + "_relu6"))
    return name + "_r"


def mobilenet_v2(size: int = 160) -> onnx.ModelProto:
    """MobileNetV2 (width 1.0, BN folded into conv bias) with He-initialised random weights."""
    rng = np.random.default_rng(0)
    nodes: list[onnx.NodeProto] = []
    inits = [numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
             numpy_helper.from_array(np.array(6.0, np.float32), "six")]
    x, cin = _conv(nodes, inits, rng, "input", 3, 32, 3, 2), 32
    blocks = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]
    for t, c, n, s in blocks:  # expansion, channels, repeats, stride
        for i in range(n):
            h = _conv(nodes, inits, rng, x, cin, cin * t, 1, 1) if t != 1 else x
            h = _conv(nodes, inits, rng, h, cin * t, cin * t, 3, s if i == 0 else 1, group=cin * t)
            h = _conv(nodes, inits, rng, h, cin * t, c, 1, 1, act=False)
            if i > 0:
                nodes.append(helper.make_node("Add", [x, h], [h + "_add"], h + "_add"))
                h = h + "_add"
            x, cin = h, c
    x = _conv(nodes, inits, rng, x, cin, 1280, 1, 1)
    nodes += [helper.make_node("GlobalAveragePool", [x], ["pool"], "pool"),
              helper.make_node("Flatten", ["pool"], ["flat"], "flat")]
    inits += [numpy_helper.from_array(rng.normal(0, 0.03, (1000, 1280)).astype(np.float32), "fc_w"),
              numpy_helper.from_array(np.zeros(1000, np.float32), "fc_b")]
    nodes.append(helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], "fc", transB=1))
    image = helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, size, size])
    graph = helper.make_graph(nodes, "mobilenetv2", [image],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 1000])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def detector_400(size: int = 256) -> onnx.ModelProto:
    """A YOLO-style detector of about 400 nodes: Conv-Sigmoid-Mul (SiLU) blocks with residual Adds, three heads."""
    rng = np.random.default_rng(1)
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []

    def silu_conv(x: str, cin: int, cout: int, k: int, s: int) -> str:
        name = f"c{len(nodes)}"
        weight = rng.normal(0, np.sqrt(1.0 / (cin * k * k)), (cout, cin, k, k)).astype(np.float32)
        inits.extend([numpy_helper.from_array(weight, f"{name}_w"),
                      numpy_helper.from_array(rng.normal(0, 0.05, cout).astype(np.float32), f"{name}_b")])
        nodes.extend([helper.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [name], name, kernel_shape=[k, k],
                                       strides=[s, s], pads=[k // 2] * 4),
                      helper.make_node("Sigmoid", [name], [name + "_s"], name + "_sig"),
                      helper.make_node("Mul", [name, name + "_s"], [name + "_m"], name + "_mul")])
        return name + "_m"

    x, cin, heads, outputs = silu_conv("images", 3, 16, 3, 2), 16, [], []
    for stage, (cout, blocks) in enumerate([(32, 8), (48, 12), (64, 14), (96, 12), (128, 8)]):
        x, cin = silu_conv(x, cin, cout, 3, 2 if stage < 4 else 1), cout
        for _ in range(blocks):
            h = silu_conv(silu_conv(x, cin, cin // 2, 1, 1), cin // 2, cin, 3, 1)
            nodes.append(helper.make_node("Add", [x, h], [h + "_add"], h + "_add"))
            x = h + "_add"
        if stage >= 2:
            heads.append((x, cin))
    for i, (feat, c) in enumerate(heads):
        name = f"head{i}"
        inits += [numpy_helper.from_array(rng.normal(0, 0.05, (3 * 9, c, 1, 1)).astype(np.float32), f"{name}_w"),
                  numpy_helper.from_array(rng.normal(0, 0.05, 3 * 9).astype(np.float32), f"{name}_b"),
                  numpy_helper.from_array(np.array([1, -1, 9], np.int64), f"{name}_shape")]
        nodes += [helper.make_node("Conv", [feat, f"{name}_w", f"{name}_b"], [f"{name}_c"], f"{name}_conv"),
                  helper.make_node("Transpose", [f"{name}_c"], [f"{name}_t"], f"{name}_tr", perm=[0, 2, 3, 1]),
                  helper.make_node("Reshape", [f"{name}_t", f"{name}_shape"], [f"{name}_r"], f"{name}_reshape"),
                  helper.make_node("Sigmoid", [f"{name}_r"], [name], f"{name}_out")]
        outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    image = helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, size, size])
    graph = helper.make_graph(nodes, "detector400", [image], outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    return onnx.shape_inference.infer_shapes(model)


def digits_mlp() -> tuple[onnx.ModelProto, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """An MLP trained here on sklearn's digits, exported by building the graph from its weights."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from sklearn.neural_network import MLPClassifier

    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    xtr, xte, ytr, yte = train_test_split(x, data.target, test_size=0.3, random_state=0, stratify=data.target)
    clf = MLPClassifier((128, 64), max_iter=400, random_state=0).fit(xtr, ytr)
    nodes, inits, h = [], [], "x"
    for i, (w, b) in enumerate(zip(clf.coefs_, clf.intercepts_, strict=False)):
        inits += [numpy_helper.from_array(w.astype(np.float32), f"w{i}"),
                  numpy_helper.from_array(b.astype(np.float32), f"b{i}")]
        nodes += [helper.make_node("MatMul", [h, f"w{i}"], [f"m{i}"], f"mm{i}"),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"], f"add{i}")]
        h = f"a{i}"
        if i < len(clf.coefs_) - 1:
            nodes.append(helper.make_node("Relu", [h], [f"r{i}"], f"relu{i}"))
            h = f"r{i}"
    graph = helper.make_graph(nodes, "digits_mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info(h, TensorProto.FLOAT, [1, 10])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), xtr, xte, ytr, yte


def write_samples(folder: Path, arrays: np.ndarray, labels: np.ndarray | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i, a in enumerate(arrays):
        np.save(folder / f"{i:05d}.npy", a[None].astype(np.float32))
    if labels is not None:
        np.save(folder / "labels.npy", labels.astype(np.int64))
    return folder


def mnist_digits(work: Path) -> tuple[Path, Path, Path]:
    from PIL import Image
    from sklearn.datasets import load_digits

    data = load_digits()
    frames = []
    for d in data.images:  # 8x8 (0..16) -> 20x20 centred in 28x28, 0..255 like MNIST
        small = Image.fromarray((d * 255 / 16).astype(np.uint8))
        big = np.asarray(small.resize((20, 20), Image.Resampling.BILINEAR), np.float32)
        frames.append(np.pad(big, 4)[None])
    imgs = np.stack(frames)
    calib = write_samples(work / "mnist_calib", imgs[:200])
    ev = write_samples(work / "mnist_eval", imgs[1000:1400], data.target[1000:1400])
    return MODELS / "mnist8-modelzoo" / "mnist-8.onnx", calib, ev


def ultraface(work: Path) -> tuple[Path, Path, Path]:
    from PIL import Image

    rng = np.random.default_rng(0)
    img = Image.open(MODELS / "ultraface-rfb320" / "satya.jpg").convert("RGB")
    def crops(n: int) -> np.ndarray:  # random crops, flips and brightness of the one upstream image
        out = []
        for _ in range(n):
            w, h = img.size
            cw, ch = int(w * rng.uniform(0.7, 1.0)), int(h * rng.uniform(0.7, 1.0))
            x0, y0 = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
            c = img.crop((x0, y0, x0 + cw, y0 + ch)).resize((320, 240), Image.Resampling.BILINEAR)
            a = np.asarray(c, np.float32) * rng.uniform(0.7, 1.2)
            a = a[:, ::-1] if rng.random() < 0.5 else a
            out.append(((a - 127.0) / 128.0).transpose(2, 0, 1))
        return np.stack(out)
    model = MODELS / "ultraface-rfb320" / "ultraface_RFB-320.onnx"
    return model, write_samples(work / "uf_calib", crops(32)), write_samples(work / "uf_eval", crops(16))
