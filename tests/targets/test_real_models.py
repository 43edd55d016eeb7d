"""Verdicts for the real models in ../shared/models, written down after checking each by hand.

Why, per model:
- mnist-8 and ultraface: plain Conv/Relu/Pool/Reshape/Softmax graphs with static inputs: one
  partition everywhere.
- rf_iris: TreeEnsembleClassifier + ZipMap (ONNX-ML): no accelerator runs them; CPU only.
- silero_vad (v5): the whole model sits in an If on the sample rate; TensorRT takes If, NNAPI,
  QNN, Myriad and NPU do not, and OpenVINO's query_model does not place it on CPU either.
- magika: static input, but its Shape->Reshape chain leaves intermediate shapes unknown to shape
  inference, so NNAPI/QNN/Myriad/NPU (static shapes only) keep 89% of nodes on the CPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import targets
from edgecore.modelcheck import load_model_checked

MODELS = Path(__file__).resolve().parents[2].parent / "shared" / "models"
NAMES = ["cpu-x86", "cpu-x86-openvino", "intel-npu", "jetson-nano", "jetson-orin", "myriad", "nnapi", "qnn-htp"]
EXPECTED = {
    "mnist8-modelzoo/mnist-8.onnx": "YES YES YES YES YES YES YES YES",
    "ultraface-rfb320/ultraface_RFB-320.onnx": "YES YES YES YES YES YES YES YES",
    "sklearn-onnxml/rf_iris.onnx": "YES NO NO NO NO NO NO NO",
    "silero-vad/silero_vad.onnx": "YES NO NO YES YES NO NO NO",
    "magika-standard_v3_3/model.onnx": "YES YES NO YES YES NO NO NO",
}


@pytest.mark.parametrize("key", list(EXPECTED))
def test_real_model_verdicts(key: str) -> None:
    if not (MODELS / key).is_file():
        pytest.skip(f"{MODELS / key} absent (real models live in ../shared/models)")
    model = load_model_checked(MODELS / key)
    got = [targets.analyse(model, targets.load_profile(name)).verdict for name in NAMES]
    assert dict(zip(NAMES, got, strict=False)) == dict(zip(NAMES, EXPECTED[key].split(), strict=False))
