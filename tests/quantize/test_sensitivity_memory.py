"""Per-tensor sensitivity streams: the same figures as onnxruntime's qdq_loss_debug, memory flat in the samples."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationMethod
from onnxruntime.quantization.qdq_loss_debug import (
    collect_activations,
    compute_activation_error,
    create_activation_matching,
    modify_model_output_intermediate_tensors,
)

from quantize.calibration import StreamingReader
from quantize.passes import quantize_int8
from quantize.recipe import CpuFeatures, Family, recipe_for
from quantize.samples import SampleSet, input_specs
from quantize.sensitivity import tensor_errors, worst_channel_sqnr
from tests.quantize.models import save, tiny_cnn

ROAD = Path(__file__).resolve().parents[3] / "shared" / "models" / "road-segmentation-adas" / \
    "road_segmentation_adas_0001.onnx"


def wide_cnn(size: int = 192, layers: int = 12, channels: int = 16) -> onnx.ModelProto:
    """Conv+Relu layers at full resolution: every activation is channels x size x size floats (a seg net's trait)."""
    rng = np.random.default_rng(0)
    nodes, inits, prev, cin = [], [], "x", 3
    for i in range(layers):
        w = (rng.standard_normal((channels, cin, 3, 3)) * 0.2).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes += [helper.make_node("Conv", [prev, f"w{i}"], [f"c{i}"], f"conv{i}", pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"], f"relu{i}")]
        prev, cin = f"r{i}", channels
    graph = helper.make_graph(nodes, "wide_cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, channels, size, size])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _qdq(model: onnx.ModelProto, tmp: Path, samples: SampleSet) -> onnx.ModelProto:
    # Per-tensor: the road model is opset 11, below per-channel DequantizeLinear's 13.
    recipe = replace(recipe_for("int8", Family.CPU, CpuFeatures(frozenset()), "uint8-qdq"), per_channel=False)
    return quantize_int8(model, recipe, StreamingReader(samples), CalibrationMethod.MinMax, tmp / "cache.json")


def _reference(float_model: onnx.ModelProto, qdq_model: onnx.ModelProto, samples: SampleSet,
               tmp: Path) -> dict[str, dict[str, float]]:
    """qdq_loss_debug's own figures, all activations of all samples in memory (what tensor_errors replaced)."""
    acts = []
    for stem, model in (("f", float_model), ("q", qdq_model)):
        onnx.save(model, tmp / f"{stem}.onnx")
        modify_model_output_intermediate_tensors(str(tmp / f"{stem}.onnx"), str(tmp / f"{stem}.aug.onnx"))
        acts.append(collect_activations(str(tmp / f"{stem}.aug.onnx"), samples))
    matching = create_activation_matching(acts[1], acts[0])
    whole = compute_activation_error(matching)
    local = compute_activation_error(matching, err_func=worst_channel_sqnr)
    return {name: {"qdq": local[name]["qdq_err"], "xmodel": whole[name]["xmodel_err"]} for name in whole}


def test_streamed_errors_equal_qdq_loss_debug(tmp_path: Path) -> None:
    model = tiny_cnn()
    samples = SampleSet.synthetic_set(input_specs(model), 6)
    qdq = _qdq(model, tmp_path, samples)
    got = {e.tensor: e for e in tensor_errors(model, qdq, samples)}
    want = _reference(model, qdq, samples, tmp_path)
    assert got and set(got) <= set(want)
    for name, error in got.items():
        assert error.qdq_sqnr == pytest.approx(min(want[name]["qdq"], 100.0), abs=1e-2), name
        assert error.xmodel_sqnr == pytest.approx(min(want[name]["xmodel"], 100.0), abs=1e-2), name


_MEASURE = """
import json, resource, sys
import onnx
from quantize.samples import SampleSet, input_specs
from quantize.sensitivity import tensor_errors
float_model, qdq_model = onnx.load(sys.argv[1]), onnx.load(sys.argv[2])
samples = SampleSet.synthetic_set(input_specs(float_model), int(sys.argv[3]))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
errors = tensor_errors(float_model, qdq_model, samples)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"grew_kb": after - before, "tensors": len(errors)}))
"""


def _growth(float_path: Path, qdq_path: Path, count: int) -> int:
    done = subprocess.run([sys.executable, "-c", _MEASURE, str(float_path), str(qdq_path), str(count)],
                          capture_output=True, text=True, timeout=300, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["tensors"] > 0
    return int(result["grew_kb"]) * 1024


def test_sensitivity_memory_does_not_grow_with_the_samples(tmp_path: Path) -> None:
    """qdq_loss_debug kept every activation of every sample: about 1 GB per sample on road-segmentation-adas.

    Here one sample's activations are 12 x 2 x 16x192x192 floats (28 MB in the float model, more with QDQ);
    8 samples held at once would grow the process by far more than 8 such samples.
    """
    model = wide_cnn()
    samples = SampleSet.synthetic_set(input_specs(model), 2)
    float_path, qdq_path = save(model, tmp_path / "wide.onnx"), tmp_path / "wide.qdq.onnx"
    onnx.save(_qdq(model, tmp_path, samples), qdq_path)
    per_sample = 2 * 12 * 16 * 192 * 192 * 4  # float model's Conv and Relu outputs of one sample
    grew = _growth(float_path, qdq_path, 8)
    assert grew < 8 * per_sample, f"tensor_errors on 8 samples grew by {grew / 2**20:.0f} MiB"


@pytest.mark.skipif(not ROAD.exists(), reason=f"{ROAD} not present (shared models not mounted)")
def test_road_segmentation_sensitivity_stays_bounded(tmp_path: Path) -> None:
    """The real 512x896 NHWC segmentation net: the per-node error report on 3 samples stays under 4 GiB.

    Holding every activation of both models took this past 11 GB (and onnxruntime out of memory) on 8.
    """
    model = onnx.load(ROAD)
    samples = SampleSet.synthetic_set(input_specs(model), 3)
    qdq_path = tmp_path / "road.qdq.onnx"
    onnx.save(_qdq(model, tmp_path, samples.head(1)), qdq_path)
    grew = _growth(ROAD, qdq_path, 3)
    assert grew < 4 * 2**30, f"tensor_errors on 3 samples grew by {grew / 2**30:.1f} GiB"
