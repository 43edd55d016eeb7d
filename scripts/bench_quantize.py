"""Benchmark `edgectl quantize` side by side: INT8 vs FP32 latency (ORT, OpenVINO), size, accuracy, cost.

Models: a MobileNetV2-style net generated here, an MLP trained here on scikit-learn's digits, a
YOLO-style detector of ~400 nodes with three output heads generated here (`auto` must end in <= 60 s),
and the real models in ../shared/models it applies to (mnist-8, ultraface RFB-320).
Each model is quantized in its own process (auto mode, target cpu-x86) so peak memory is its own.
Rerun: ./scripts/bench quantize
"""

from __future__ import annotations

import os
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
DETECTOR = "detector ~400 nodes (generated)"
MODELS = ROOT.parent / "shared" / "models"
sys.path.insert(0, str(ROOT))

T = TypeVar("T")
Report = dict[str, Any]  # quantize_one's result: the report's data, wall time, peak RSS
Row = tuple[str, Report]


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


def _write(folder: Path, arrays: np.ndarray, labels: np.ndarray | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i, a in enumerate(arrays):
        np.save(folder / f"{i:05d}.npy", a[None].astype(np.float32))
    if labels is not None:
        np.save(folder / "labels.npy", labels.astype(np.int64))
    return folder


def _mnist_digits(work: Path) -> tuple[Path, Path, Path]:
    from PIL import Image
    from sklearn.datasets import load_digits

    data = load_digits()
    frames = []
    for d in data.images:  # 8x8 (0..16) -> 20x20 centred in 28x28, 0..255 like MNIST
        small = Image.fromarray((d * 255 / 16).astype(np.uint8))
        big = np.asarray(small.resize((20, 20), Image.Resampling.BILINEAR), np.float32)
        frames.append(np.pad(big, 4)[None])
    imgs = np.stack(frames)
    calib = _write(work / "mnist_calib", imgs[:200])
    ev = _write(work / "mnist_eval", imgs[1000:1400], data.target[1000:1400])
    return MODELS / "mnist8-modelzoo" / "mnist-8.onnx", calib, ev


def _ultraface(work: Path) -> tuple[Path, Path, Path]:
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
    return model, _write(work / "uf_calib", crops(32)), _write(work / "uf_eval", crops(16))


def quantize_one(model: str, calib: str | None, eval_dir: str | None, synthetic: int, measure: bool) -> Report:
    """Run the pipeline in this (fresh) process; report figures, wall time and peak RSS."""
    from rich.console import Console

    from quantize import QuantizeRequest, run_quantize

    start = time.perf_counter()
    req = QuantizeRequest(model=Path(model), target="cpu-x86", output=Path(tempfile.mkdtemp()) / "o.onnx",
                          calib_dir=Path(calib) if calib else None, calib_synthetic=synthetic,
                          eval_dir=Path(eval_dir) if eval_dir else None, measure=measure, max_drop=1.0)
    report = run_quantize(req, Console(quiet=True))
    return {"data": report.data, "wall_s": time.perf_counter() - start,
            "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def calibration_peak(model: str, samples: int) -> float:
    """Peak RSS (MB) of a process that only calibrates and quantizes (int8, no eval, no latency)."""
    from rich.console import Console

    from quantize import Mode, QuantizeRequest, run_quantize

    request = QuantizeRequest(model=Path(model), target="jetson-orin", output=Path("/dev/null"), mode=Mode.INT8,
                              calib_synthetic=samples, measure=False, max_drop=100.0, max_eval=4)
    run_quantize(request, Console(quiet=True))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _in_child(fn: Callable[..., T], *args: Any) -> T:
    with ProcessPoolExecutor(1, mp_context=get_context("spawn"), max_tasks_per_child=1) as pool:
        return pool.submit(fn, *args).result()


def main() -> int:
    flags = Path("/proc/cpuinfo").read_text().split("flags")[1].split("\n")[0].split()
    vnni = bool({"avx512_vnni", "avx_vnni"} & set(flags))
    print(f"host: {'VNNI present (' + ', '.join(f for f in flags if 'vnni' in f) + ')' if vnni else 'no VNNI'}")
    rows: list[Row] = []
    goals: list[tuple[bool, str]] = []
    with tempfile.TemporaryDirectory(prefix="bench-quantize-") as tmp:
        work = Path(tmp)
        mnv2 = work / "mobilenetv2.onnx"
        onnx.save(mobilenet_v2(), mnv2)
        rng = np.random.default_rng(0)
        mn_calib = _write(work / "mn_calib", rng.random((32, 3, 160, 160), dtype=np.float32) * 2 - 1)
        mn_eval = _write(work / "mn_eval", rng.random((16, 3, 160, 160), dtype=np.float32) * 2 - 1)
        mlp, xtr, xte, _ytr, yte = digits_mlp()
        onnx.save(mlp, work / "digits_mlp.onnx")
        cases: list[tuple[str, ...]] = [("mobilenetv2-160 (generated)", str(mnv2), str(mn_calib), str(mn_eval)),
                 ("digits MLP (trained here)", str(work / "digits_mlp.onnx"), str(_write(work / "d_calib", xtr[:300])),
                  str(_write(work / "d_eval", xte, yte)))]
        det = work / "detector400.onnx"
        onnx.save(detector_400(), det)
        det_calib = _write(work / "det_calib", rng.random((32, 3, 256, 256), dtype=np.float32))
        det_eval = _write(work / "det_eval", rng.random((16, 3, 256, 256), dtype=np.float32))
        cases.append((DETECTOR, str(det), str(det_calib), str(det_eval)))
        if MODELS.is_dir():
            cases += [("mnist-8", *map(str, _mnist_digits(work))), ("ultraface RFB-320", *map(str, _ultraface(work)))]
        for name, model, calib, ev in cases:
            result = _in_child(quantize_one, model, calib, ev, 0, True)
            rows.append((name, result))
        peaks = {n: _in_child(calibration_peak, str(mnv2), n) for n in (100, 1000)}
    print(_table(rows))
    goals += _goals(rows, peaks, vnni)
    for ok, text in goals:
        print(f"{'PASS' if ok else 'FAIL'}  {text}")
    print("\nrerun: ./scripts/bench quantize")
    return 0


def _variant(data: Report, name: str) -> Report:
    variant: Report = next(v for v in data["variants"] if v["name"] == name)
    return variant


def _ratio(data: Report, name: str, key: str) -> float:
    a, b = _variant(data, name)["latency"].get(key), _variant(data, "float")["latency"].get(key)
    return a / b if a and b else float("nan")


def _table(rows: list[Row]) -> str:
    head = (f"{'model':28} {'INT8/FP32 ORT':>13} {'INT8/FP32 OV':>12} {'size':>6} {'INT8 drop':>10} "
            f"{'auto':>13} {'auto/FP32':>9} {'wall s':>7} {'peak MB':>8}")
    lines = [head, "-" * len(head)]
    for name, r in rows:
        d = r["data"]
        i8 = _variant(d, "int8")
        lines.append(f"{name:28} {_ratio(d, 'int8', 'ort_ms'):13.2f} {_ratio(d, 'int8', 'openvino_ms'):12.2f} "
                     f"{i8['size_ratio']:6.2f} {i8['accuracy']['drop']:6.2f} pt  {d['chosen']:>13} "
                     f"{_ratio(d, d['chosen'], 'ort_ms'):9.2f} {r['wall_s']:7.1f} {r['peak_mb']:8.0f}")
        lines.append(f"{'':28} metric: {i8['accuracy']['metric']} (float {i8['accuracy']['reference']:.2f}); "
                     f"int8-compute ORT ratio {_ratio(d, 'int8-compute', 'ort_ms'):.2f}; "
                     f"kept float: {len(i8['kept_float'])}")
    return "\n".join(lines)


def _goals(rows: list[Row], peaks: dict[int, float], vnni: bool) -> list[tuple[bool, str]]:
    out: list[tuple[bool, str]] = []
    mn = rows[0][1]["data"]
    r = _ratio(mn, "int8", "ort_ms")
    out.append((r <= 0.55, f"MobileNetV2 INT8/FP32 ORT latency {r:.2f} <= 0.55 ({'VNNI' if vnni else 'no VNNI'} host)"))
    for name, res in rows:
        d = res["data"]
        chosen = _ratio(d, d["chosen"], "ort_ms")
        fastest = min(_variant(d, v["name"])["latency"]["ort_ms"] for v in d["variants"]
                      if v["accuracy"]["drop"] <= d["max_drop"])
        within = _variant(d, d["chosen"])["latency"]["ort_ms"] <= fastest * 1.05
        out.append((chosen <= 1.0 and within,
                    f"{name}: auto ({d['chosen']}) ratio {chosen:.2f} <= 1.0 and within 5% of fastest within budget"))
        if d["chosen"] != "float":
            size = _variant(d, d["chosen"])["size_ratio"]
            out.append((size <= 0.30, f"{name}: size ratio {size:.2f} <= 0.30 where INT8 chosen"))
    digits = rows[1][1]["data"]
    drop = _variant(digits, "int8")["accuracy"]["drop"]
    out.append((drop <= 1.0, f"digits top-1 drop {drop:.2f} <= 1 point"))
    for name, res in rows:
        if name == DETECTOR:
            out.append((res["wall_s"] <= 60.0, f"{name}: auto (cpu-x86, 3 variants, latency measured) took "
                        f"{res['wall_s']:.1f} s <= 60 s (issue 14; {os.cpu_count()} cores)"))
    growth = peaks[1000] / peaks[100]
    out.append((growth <= 1.10, f"calibration peak memory 100 -> 1000 samples: {peaks[100]:.0f} -> {peaks[1000]:.0f} MB "
                                f"(x{growth:.2f} <= 1.10)"))
    return out


if __name__ == "__main__":
    sys.exit(main())
