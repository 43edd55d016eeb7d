"""The local KServe v2 API through the real tritonclient, bad requests, and swaps under load."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import tritonclient.http as triton
from onnx import TensorProto, helper, numpy_helper
from tritonclient.utils import InferenceServerException

from agent.catalog import Candidate
from agent.serving import InferenceServer, ModelRegistry
from agent.telemetry import device_metrics
from edgecore.backends import Runner


def scale_model(path: Path, factor: float) -> Path:
    """y = x * factor, float32 [batch, 4]; plus a string passthrough s -> t."""
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "k"], ["y"]), helper.make_node("Identity", ["s"], ["t"])],
        "scale",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4]),
         helper.make_tensor_value_info("s", TensorProto.STRING, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4]),
         helper.make_tensor_value_info("t", TensorProto.STRING, [2])],
        [numpy_helper.from_array(np.array(factor, np.float32), "k")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def ort_runner(path: Path) -> Runner:
    return Candidate("onnxruntime", "CPUExecutionProvider").open(path)


Served = tuple[InferenceServer, ModelRegistry, Path]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    registry = ModelRegistry()
    registry.publish("scale", "1", ort_runner(scale_model(tmp_path / "s2.onnx", 2.0)), {"sha256": "abc"})
    server = InferenceServer(
        registry, max_request_bytes=64 * 1024, device_metrics=lambda: device_metrics(tmp_path).to_json()
    )
    server.start()
    yield server, registry, tmp_path
    server.stop()
    registry.close()


def client(server: InferenceServer) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(f"127.0.0.1:{server.port}", concurrency=4)


def inputs(x: np.ndarray, binary: bool = True, x_type: str = "FP32", x_name: str = "x") -> list[triton.InferInput]:
    first = triton.InferInput(x_name, list(x.shape), x_type)
    first.set_data_from_numpy(x, binary_data=binary)
    second = triton.InferInput("s", [2], "BYTES")
    second.set_data_from_numpy(np.array([b"edge", b"ctl"], dtype=object), binary_data=binary)
    return [first, second]


def test_health_and_metadata(served: Served) -> None:
    server, _, _ = served
    c = client(server)
    assert c.is_server_live() and c.is_server_ready()
    assert c.is_model_ready("scale") and c.is_model_ready("scale", "1")
    assert not c.is_model_ready("scale", "7") and not c.is_model_ready("nope")
    assert "binary_tensor_data" in c.get_server_metadata()["extensions"]
    meta = c.get_model_metadata("scale")
    assert meta["versions"] == ["1"] and meta["platform"] == "onnxruntime_onnx"
    assert meta["parameters"]["backend"] == "onnxruntime/CPUExecutionProvider"
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]},
                              {"name": "s", "datatype": "BYTES", "shape": [2]}]


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_infer_round_trip(served: Served, binary: bool) -> None:
    server, _, _ = served
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    outputs = [triton.InferRequestedOutput(n, binary_data=binary) for n in ("y", "t")]
    result = client(server).infer("scale", inputs(x, binary), outputs=outputs, request_id="r1")
    np.testing.assert_array_equal(result.as_numpy("y"), x * 2)
    assert [v if isinstance(v, bytes) else v.encode() for v in result.as_numpy("t")] == [b"edge", b"ctl"]
    assert result.get_response()["id"] == "r1"


def test_default_outputs_come_back_binary(served: Served) -> None:
    server, _, _ = served
    result = client(server).infer("scale", inputs(np.ones((1, 4), np.float32)), model_version="1")
    np.testing.assert_array_equal(result.as_numpy("y"), np.full((1, 4), 2, np.float32))
    assert result.get_output("y")["parameters"]["binary_data_size"] == 16


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: inputs(np.ones((1, 4), np.float32), x_name="z"), "unknown input 'z'"),
        (lambda: inputs(np.ones((1, 4), np.float64), x_type="FP64"), "input 'x' expects datatype FP32, got FP64"),
        (lambda: inputs(np.ones((1, 5), np.float32)), "input 'x' expects shape"),
        (lambda: inputs(np.ones((1, 4), np.float32))[:1], "missing input 's'"),
    ],
)
def test_bad_requests_name_the_tensor(served: Served, build: Callable[[], list[triton.InferInput]], message: str) -> None:
    server, registry, _ = served
    c = client(server)
    with pytest.raises(InferenceServerException, match=message):
        c.infer("scale", build())
    assert c.infer("scale", inputs(np.ones((1, 4), np.float32))).as_numpy("y") is not None
    assert registry.telemetry()["scale"]["errors"] == 1


def post(server: InferenceServer, body: bytes, headers: dict[str, str],
         path: str = "/v2/models/scale/infer") -> tuple[int, dict[str, Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request("POST", path, body=body, headers=headers)
    response = conn.getresponse()
    payload = response.read()
    conn.close()
    return response.status, json.loads(payload) if payload.startswith(b"{") else {}


def test_size_mismatch_and_malformed_bodies_are_400(served: Served) -> None:
    server, _, _ = served
    header = json.dumps({"inputs": [
        {"name": "x", "datatype": "FP32", "shape": [1, 4], "parameters": {"binary_data_size": 12}},
        {"name": "s", "datatype": "BYTES", "shape": [2], "data": ["a", "b"]},
    ]}).encode()
    status, body = post(server, header + bytes(12), {"Inference-Header-Content-Length": str(len(header))})
    assert status == 400 and body["error"] == "input 'x' has 12 bytes; shape [1, 4] FP32 needs 16"
    json_header = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3]}]})
    status, body = post(server, json_header.encode(), {})
    assert status == 400 and "input 'x' has 3 elements" in body["error"]
    status, body = post(server, b"{nope", {})
    assert status == 400 and "malformed" in body["error"]
    status, body = post(server, b"{}", {}, path="/v2/models/missing/infer")
    assert status == 404 and "'missing' is not published" in body["error"]


def test_request_size_cap_is_413_and_server_keeps_serving(served: Served) -> None:
    server, _, _ = served
    status, body = post(server, bytes(100 * 1024), {"Content-Type": "application/octet-stream"})
    assert status == 413 and "limit is 65536" in body["error"]
    assert client(server).is_server_live()


def test_metrics_are_prometheus_text(served: Served) -> None:
    server, _, _ = served
    client(server).infer("scale", inputs(np.ones((1, 4), np.float32)))
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request("GET", "/metrics")
    response = conn.getresponse()
    text = response.read().decode()
    assert (response.getheader("Content-Type") or "").startswith("text/plain; version=0.0.4")
    assert 'edge_agent_inference_requests_total{model="scale"} 1.0' in text
    assert 'edge_agent_model_info{backend="onnxruntime/CPUExecutionProvider",model="scale",placement="cpu",version="1"} 1.0' \
        in text
    assert 'edge_agent_inference_latency_seconds{model="scale",quantile="0.99"}' in text
    assert "edge_agent_state_disk_free_bytes " in text and "edge_agent_process_resident_bytes " in text


def test_swap_under_load_fails_no_request(served: Served) -> None:
    server, registry, tmp_path = served
    paths = [scale_model(tmp_path / f"s{f}.onnx", float(f)) for f in (2, 3)]
    errors: list[BaseException] = []
    seen: set[float] = set()
    stop = threading.Event()

    def hammer() -> None:
        c = triton.InferenceServerClient(f"127.0.0.1:{server.port}")
        while not stop.is_set():
            try:
                seen.add(float(c.infer("scale", inputs(np.ones((1, 4), np.float32))).as_numpy("y")[0, 0]))
            except BaseException as exc:
                errors.append(exc)

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for t in threads:
        t.start()
    old_runners = []
    for version in range(2, 12):
        old_runners.append(registry.get("scale").runner)
        registry.publish("scale", str(version), ort_runner(paths[version % 2]), {})
    stop.set()
    for t in threads:
        t.join()
    assert errors == []
    assert seen <= {2.0, 3.0} and registry.get("scale").version == "11"
    assert not any(r.is_active for r in old_runners)


def test_retired_runner_closes_after_its_last_request(tmp_path: Path) -> None:
    registry = ModelRegistry()
    registry.publish("m", "1", ort_runner(scale_model(tmp_path / "a.onnx", 2.0)))
    with registry.acquire("m") as held:
        registry.publish("m", "2", ort_runner(scale_model(tmp_path / "b.onnx", 3.0)))
        assert held.runner.is_active  # still serving the in-flight request
        out = held.runner.infer({"x": np.ones((1, 4), np.float32), "s": np.array(["a", "b"], dtype=object)})
        assert out["y"][0, 0] == 2.0
    assert not held.runner.is_active and registry.get("m").version == "2"
    registry.unpublish("m")
    assert registry.names() == []
