"""The Android app's side of the protocol (packaging/android/reference_client.py) against the real edgectl and Mosquitto.

The reference client imports nothing of this project; this test is what keeps it, the spec a Kotlin
port follows, true: `edgectl deploy` of an nnapi package (with its ORT-format model) reaches it, and
it refuses what a device must refuse.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from edgecore.protocol.envelope import sign
from edgectl.examples import tiny_classifier
from tests.brokers import BrokerProcess
from tests.checkout import REPO
from tests.fleet import EdgectlHome, wait_for

sys.path.insert(0, str(REPO / "packaging" / "android"))
from reference_client import AppClient, Refused, open_envelope, pae


def test_the_app_takes_an_nnapi_deployment_and_answers_from_the_ort_model(
    tmp_path: Path, mosquitto: BrokerProcess, edgectl_home: EdgectlHome,
) -> None:
    model = tiny_classifier(tmp_path / "det.onnx", seed=12)
    package = tmp_path / "det.edgepkg"
    edgectl_home.edgectl("build", str(model), "--name", "det", "--version", "1", "--target", "nnapi", "--ort-out",
                         str(tmp_path / "android"), "-o", str(package), check=True)
    app = AppClient("phone-1", "127.0.0.1", mosquitto.port, [edgectl_home.public_key("controller").read_bytes()],
                    [edgectl_home.public_key("package").read_bytes()]).start()
    try:
        result = edgectl_home.edgectl("deploy", str(package), "--device", "phone-1", "--json", "--timeout", "60")
        assert result.returncode == 0, result.stdout + result.stderr
        outcome = {d["device_id"]: d for d in json.loads(result.stdout)["devices"]}["phone-1"]
        assert outcome["status"] == "ok" and "from model.ort" in outcome["detail"]
        x = np.random.default_rng(2).standard_normal((1, 3, 32, 32)).astype(np.float32)
        want = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"image": x})[0]
        np.testing.assert_allclose(app.infer({"image": x})[0], want, rtol=1e-5, atol=1e-6)
        listing = wait_for(lambda: [d for d in json.loads(edgectl_home.edgectl("devices", "--json", check=True).stdout)
                                    if d["device_id"] == "phone-1" and d.get("version") == 1], 30, "the app's state")
        assert listing[0]["model"] == "det"
    finally:
        app.stop()


def test_an_envelope_is_opened_only_under_a_trusted_signature() -> None:
    key = Ed25519PrivateKey.generate()
    pem = key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    envelope = json.loads(sign("application/x-test", b'{"a": 1}', key).to_bytes())
    trusted = {envelope["signatures"][0]["keyid"]: pem}
    assert open_envelope(envelope, "application/x-test", trusted) == {"a": 1}
    with pytest.raises(Refused, match="type"):
        open_envelope(envelope, "application/x-other", trusted)
    with pytest.raises(Refused, match="no trusted signature"):
        open_envelope(envelope, "application/x-test", {})
    tampered = {**envelope, "payload": "eyJhIjogMn0="}  # {"a": 2}
    with pytest.raises(Refused, match="no trusted signature"):
        open_envelope(tampered, "application/x-test", trusted)
    assert pae("t", b"xy") == b"DSSEv1 1 t 2 xy"
