"""Open Inference Protocol conformance: the departures issue 13 found, and schemathesis against the official spec."""

from __future__ import annotations

import http.client
import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as triton
import yaml

from agent.serving import InferenceServer, ModelRegistry
from tests.agent.test_serving import ort_runner, scale_model

SPEC = Path(__file__).resolve().parents[3] / "shared" / "specs" / "open-inference-protocol" / "open_inference_rest.yaml"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InferenceServer]:
    registry = ModelRegistry()
    registry.publish("scale", "1", ort_runner(scale_model(tmp_path_factory.mktemp("m") / "s.onnx", 2.0)))
    srv = InferenceServer(registry, max_request_bytes=1 << 20)
    srv.start()
    yield srv
    srv.stop()
    registry.close()


def request(server: InferenceServer, method: str, path: str, body: bytes | None = None,
            headers: dict[str, str] | None = None) -> tuple[int, bytes, http.client.HTTPResponse]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request(method, path, body=body, headers=headers or {})
    response = conn.getresponse()
    payload = response.read()
    conn.close()
    return response.status, payload, response


def infer(server: InferenceServer, doc: Any, binary: bytes = b"") -> tuple[int, Any, http.client.HTTPResponse]:
    header = json.dumps(doc).encode() if not isinstance(doc, bytes) else doc
    extra = {"Inference-Header-Content-Length": str(len(header))} if binary else {}
    status, payload, response = request(server, "POST", "/v2/models/scale/infer", header + binary, extra)
    length = response.getheader("Inference-Header-Content-Length")
    head = payload[:int(length)] if length else payload
    return status, json.loads(head), response


def x_input(data: list[Any] | None = None, shape: list[Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {"name": "x", "datatype": "FP32", "shape": shape or [1, 4], "data": data or [1, 2, 3, 4], **extra}


def s_input() -> dict[str, Any]:
    return {"name": "s", "datatype": "BYTES", "shape": [2], "data": ["a", "b"]}


@pytest.mark.parametrize(("doc", "message"), [
    ({"inputs": [x_input(), s_input()], "parameters": 5}, "'parameters' must be an object, got int"),
    ({"inputs": [x_input(parameters=[1]), s_input()]}, "'parameters' of input 'x' must be an object, got list"),
    ({"inputs": [x_input(), s_input()], "outputs": [{"name": "y", "parameters": "bin"}]},
     "'outputs[0].parameters' must be an object, got str"),
    ({"inputs": [x_input(shape=[2**64, 4]), s_input()]}, "input 'x' shape dimension 18446744073709551616 exceeds"),
    ({"inputs": [x_input(shape=[2**63, 0]), s_input()]}, "input 'x' shape dimension 9223372036854775808 exceeds"),
    ({"inputs": [x_input(shape=[2**62, 4]), s_input()]},
     "input 'x' has 4 elements; shape [4611686018427387904, 4] needs 18446744073709551616"),
    ({"inputs": [x_input(data=[1, None, 3, 4]), s_input()]}, "input 'x': data holds null"),
    ({"inputs": [x_input(), s_input()], "id": 7}, "'id' must be a string, got int"),
])
def test_bad_fields_are_400_naming_the_field(server: InferenceServer, doc: dict[str, Any], message: str) -> None:
    status, body, _ = infer(server, doc)
    assert status == 400 and body["error"].startswith(message), body


def test_nan_and_infinity_tokens_are_rejected_not_parsed(server: InferenceServer) -> None:
    raw = b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [NaN, Infinity, 1, 2]},' \
          b' {"name": "s", "datatype": "BYTES", "shape": [2], "data": ["a", "b"]}]}'
    status, body, _ = infer(server, raw)
    assert status == 400 and "NaN is not JSON" in body["error"]


def test_non_finite_outputs_are_not_sent_as_json(server: InferenceServer) -> None:
    big = np.array([3e38, 1, 2, 3], np.float32)  # * 2 overflows to inf
    doc: dict[str, Any] = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "parameters": {"binary_data_size": 16}},
                                      s_input()]}
    status, body, response = infer(server, doc, big.tobytes())
    assert status == 400 and body["error"] == "output 'y' holds NaN or Infinity, which JSON cannot carry: ask for binary_data"
    doc["parameters"] = {"binary_data_output": True}
    status, body, response = infer(server, doc, big.tobytes())
    assert status == 200 and response.getheader("Content-Type") == "application/octet-stream"


def test_binary_data_false_on_an_output_overrides_binary_data_output(server: InferenceServer) -> None:
    doc = {"inputs": [x_input(), s_input()], "parameters": {"binary_data_output": True},
           "outputs": [{"name": "y", "parameters": {"binary_data": False}}, {"name": "t"}]}
    status, body, _ = infer(server, doc)
    y, t = body["outputs"]
    assert status == 200 and y["data"] == [2, 4, 6, 8] and "binary_data_size" not in y.get("parameters", {})
    assert t["parameters"]["binary_data_size"] == 10  # 4+1 and 4+1: "a", "b"


def bytes_tensor(items: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(i)) + i for i in items)


def test_binary_bytes_round_trip_is_exact(server: InferenceServer) -> None:
    items = ["é日本".encode(), b"\x00zero\x00"]
    raw = bytes_tensor(items)
    x = np.ones((1, 4), np.float32).tobytes()
    doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "parameters": {"binary_data_size": 16}},
                      {"name": "s", "datatype": "BYTES", "shape": [2], "parameters": {"binary_data_size": len(raw)}}],
           "outputs": [{"name": "t", "parameters": {"binary_data": True}}]}
    header = json.dumps(doc).encode()
    status, payload, response = request(server, "POST", "/v2/models/scale/infer", header + x + raw,
                                        {"Inference-Header-Content-Length": str(len(header))})
    assert status == 200 and payload[int(response.getheader("Inference-Header-Content-Length") or 0):] == raw


def test_non_utf8_bytes_are_refused_not_replaced(server: InferenceServer) -> None:
    raw = bytes_tensor([b"ok", b"\xff\xfe"])
    doc = {"inputs": [x_input(), {"name": "s", "datatype": "BYTES", "shape": [2], "parameters": {"binary_data_size": len(raw)}}]}
    status, body, _ = infer(server, doc, raw)
    assert status == 400 and body["error"].startswith("input 's' element 1 is not UTF-8")


def test_metadata_platform_follows_the_protocol(server: InferenceServer) -> None:
    meta = triton.InferenceServerClient(f"127.0.0.1:{server.port}").get_model_metadata("scale")
    assert meta["platform"] == "onnxruntime_onnx" and meta["parameters"]["backend"] == "onnxruntime/CPUExecutionProvider"


@pytest.mark.parametrize(("method", "path", "allow"), [
    ("PUT", "/v2/health/live", "GET, HEAD"),
    ("DELETE", "/v2/models/scale", "GET, HEAD"),
    ("GET", "/v2/models/scale/infer", "POST"),
    ("PATCH", "/v2/models/scale/versions/1/infer", "POST"),
])
def test_other_methods_get_json_405_with_allow(server: InferenceServer, method: str, path: str, allow: str) -> None:
    status, payload, response = request(server, method, path)
    assert status == 405 and response.getheader("Allow") == allow
    assert response.getheader("Content-Type") == "application/json" and f"{method} is not allowed" in json.loads(payload)["error"]


def test_head_answers_headers_only(server: InferenceServer) -> None:
    status, payload, response = request(server, "HEAD", "/v2/models/scale")
    assert status == 200 and payload == b"" and int(response.getheader("Content-Length") or 0) > 0


def test_ready_only_with_a_model(tmp_path: Path) -> None:
    registry = ModelRegistry()
    srv = InferenceServer(registry)
    srv.start()
    try:
        c = triton.InferenceServerClient(f"127.0.0.1:{srv.port}")
        assert c.is_server_live() and not c.is_server_ready()
        registry.publish("scale", "1", ort_runner(scale_model(tmp_path / "s.onnx", 2.0)))
        assert c.is_server_ready()
        registry.unpublish("scale")
        assert not c.is_server_ready()
    finally:
        srv.stop()
        registry.close()


# -- schemathesis against the official OpenAPI file ---------------------------------------------

def adapted_spec() -> dict[str, Any]:
    """The spec with ``${X}`` path templates as ``{X}`` and the prose spec's versionless model paths added."""
    spec: dict[str, Any] = yaml.safe_load(SPEC.read_text())
    paths = {path.replace("${", "{"): item for path, item in spec["paths"].items()}
    for path in list(paths):
        if "/versions/{MODEL_VERSION}" in path:
            item = json.loads(json.dumps(paths[path]))
            item["parameters"] = [p for p in item["parameters"] if p["name"] != "MODEL_VERSION"]
            for op in item.values():
                if isinstance(op, dict) and "operationId" in op:
                    op["operationId"] += "-versionless"
            paths[path.replace("/versions/{MODEL_VERSION}", "")] = item
    spec["paths"] = paths
    return spec


if SPEC.exists():
    import schemathesis
    from hypothesis import HealthCheck, settings

    schema = schemathesis.openapi.from_dict(adapted_spec())

    @schema.parametrize()
    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    def test_schemathesis_official_spec(case: Any, server: InferenceServer) -> None:
        params = case.path_parameters or {}
        if "MODEL_NAME" in params and len(str(params["MODEL_NAME"])) % 4 != 3:
            params["MODEL_NAME"] = "scale"  # mostly the served model, sometimes whatever was generated
            if "MODEL_VERSION" in params and len(str(params["MODEL_VERSION"])) % 2:
                params["MODEL_VERSION"] = "1"
        response = case.call(base_url=f"http://127.0.0.1:{server.port}")
        assert response.status_code < 500, response.text[:300]
        case.validate_response(response, checks=[schemathesis.checks.not_a_server_error,
                                                 schemathesis.checks.response_schema_conformance,
                                                 schemathesis.checks.content_type_conformance])
        if response.status_code == 200 and "json" in str(response.headers.get("Content-Type", "")):
            json.loads(response.text, parse_constant=lambda token: pytest.fail(f"{token} in a 200 answer"))
else:
    def test_schemathesis_official_spec() -> None:
        pytest.skip(f"{SPEC} is absent")
