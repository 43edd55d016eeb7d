"""The gRPC Open Inference Protocol, driven by tritonclient.grpc (sync, asyncio, streaming) against a real server."""

from __future__ import annotations

import asyncio
import http.client
import json
import queue
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import onnx
import pytest
import tritonclient.grpc as tg
import tritonclient.grpc.aio as tg_aio
import tritonclient.http as th
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from agent.config import InferenceSettings
from agent.serving import InferenceServer, ModelRegistry
from agent.serving.access import TlsFiles
from agent.serving.http11 import HttpLimits
from agent.serving.oip import inference_pb2 as pb
from agent.serving.server import ServingLimits
from edgectl.pki import Algorithm, FleetPki
from edgectl.pki.certs import Usage
from tests.agent.test_serving import ort_runner, scale_model
from tests.agent.test_serving_limits import GatedRunner, infer_body
from tests.checkout import checkout_env

ROOT = Path(__file__).resolve().parents[2]
# Every datatype the HTTP side supports, with the ONNX element type that carries it.
DATATYPES = {
    "BOOL": (TensorProto.BOOL, np.bool_), "UINT8": (TensorProto.UINT8, np.uint8),
    "UINT16": (TensorProto.UINT16, np.uint16), "UINT32": (TensorProto.UINT32, np.uint32),
    "UINT64": (TensorProto.UINT64, np.uint64), "INT8": (TensorProto.INT8, np.int8), "INT16": (TensorProto.INT16, np.int16),
    "INT32": (TensorProto.INT32, np.int32), "INT64": (TensorProto.INT64, np.int64), "FP16": (TensorProto.FLOAT16, np.float16),
    "FP32": (TensorProto.FLOAT, np.float32), "FP64": (TensorProto.DOUBLE, np.float64), "BYTES": (TensorProto.STRING, np.object_),
}


def identity_model(path: Path) -> Path:
    """One Identity per datatype: in_<TYPE> [2, 3] -> out_<TYPE>."""
    nodes = [helper.make_node("Identity", [f"in_{t}"], [f"out_{t}"]) for t in DATATYPES]
    graph = helper.make_graph(
        nodes, "every_type",
        [helper.make_tensor_value_info(f"in_{t}", onnx_type, [2, 3]) for t, (onnx_type, _) in DATATYPES.items()],
        [helper.make_tensor_value_info(f"out_{t}", onnx_type, [2, 3]) for t, (onnx_type, _) in DATATYPES.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def sample(datatype: str) -> np.ndarray:
    """Values that would not survive a lossy path: extremes, a NaN, NUL and multi-byte UTF-8 (runtimes take UTF-8)."""
    dtype = DATATYPES[datatype][1]
    if datatype == "BYTES":
        return np.array([b"", b"tab\there", "é日本".encode(), b"\x00", b"a" * 300, b"z"], dtype=object).reshape(2, 3)
    if datatype == "BOOL":
        return np.array([[True, False, True], [False, False, True]])
    if np.dtype(dtype).kind == "f":
        info = np.finfo(dtype)
        return np.array([[info.min, info.max, np.nan], [np.inf, -0.0, info.tiny]], dtype)
    info_i = np.iinfo(dtype)
    return np.array([[info_i.min, info_i.max, 0], [1, 2, 3]], dtype)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InferenceServer]:
    work = tmp_path_factory.mktemp("grpc")
    registry = ModelRegistry()
    registry.publish("scale", "1", ort_runner(scale_model(work / "s.onnx", 2.0)))
    registry.publish("every", "3", ort_runner(identity_model(work / "every.onnx")))
    server = InferenceServer(registry, grpc_port=0)
    server.start()
    yield server
    server.stop()
    registry.close()


def target(server: InferenceServer) -> str:
    assert server.grpc is not None
    return server.grpc.target


def grpc_inputs(arrays: dict[str, np.ndarray], datatypes: dict[str, str]) -> list[tg.InferInput]:
    out = []
    for name, array in arrays.items():
        tensor = tg.InferInput(name, list(array.shape), datatypes[name])
        tensor.set_data_from_numpy(array)
        out.append(tensor)
    return out


def scale_inputs(x: np.ndarray) -> list[tg.InferInput]:
    return grpc_inputs({"x": x, "s": np.array([b"edge", b"ctl"], dtype=object)}, {"x": "FP32", "s": "BYTES"})


def assert_same(got: np.ndarray | None, want: np.ndarray) -> None:
    assert got is not None and got.shape == want.shape
    if want.dtype == object:
        assert list(got.reshape(-1)) == list(want.reshape(-1))
    else:
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes()


def test_health_metadata_and_repository_index(served: InferenceServer) -> None:
    client = tg.InferenceServerClient(target(served))
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("scale") and client.is_model_ready("every", "3")
    assert client.get_server_metadata().name == "edge-agent"
    meta = client.get_model_metadata("scale", as_json=True)
    assert meta["platform"] == "onnxruntime_onnx" and meta["versions"] == ["1"]
    assert meta["inputs"][0] == {"name": "x", "datatype": "FP32", "shape": ["-1", "4"]}  # int64 in JSON is a string
    index = client.get_model_repository_index(as_json=True)["models"]
    assert [(m["name"], m["version"], m["state"]) for m in index] == [("every", "3", "READY"), ("scale", "1", "READY")]
    with pytest.raises(InferenceServerException, match="model 'nope' is not published") as caught:
        client.get_model_metadata("nope")
    assert caught.value.status() == "StatusCode.NOT_FOUND"
    with pytest.raises(InferenceServerException, match="version '9' is not published"):
        client.get_model_metadata("scale", "9")


def test_every_datatype_round_trips_exactly_over_grpc_and_http(served: InferenceServer) -> None:
    arrays = {f"in_{t}": sample(t) for t in DATATYPES}
    types = {f"in_{t}": t for t in DATATYPES}
    result = tg.InferenceServerClient(target(served)).infer("every", grpc_inputs(arrays, types))
    for t in DATATYPES:
        assert_same(result.as_numpy(f"out_{t}"), arrays[f"in_{t}"])
        assert result.get_output(f"out_{t}").datatype == t
    http_inputs = []
    for name, array in arrays.items():
        tensor = th.InferInput(name, list(array.shape), types[name])
        tensor.set_data_from_numpy(array, binary_data=True)
        http_inputs.append(tensor)
    over_http = th.InferenceServerClient(f"127.0.0.1:{served.port}").infer("every", http_inputs)
    for t in DATATYPES:
        assert_same(over_http.as_numpy(f"out_{t}"), arrays[f"in_{t}"])
    arrays["in_BYTES"] = np.array([b"ok", b"\xff\xfe", b"", b"", b"", b""], dtype=object).reshape(2, 3)
    with pytest.raises(InferenceServerException, match="input 'in_BYTES' element 1 is not UTF-8") as caught:
        tg.InferenceServerClient(target(served)).infer("every", grpc_inputs(arrays, types))
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"


def test_infer_with_asked_outputs_and_request_id(served: InferenceServer) -> None:
    client = tg.InferenceServerClient(target(served))
    result = client.infer("scale", scale_inputs(np.ones((3, 4), np.float32)), request_id="r-7",
                          outputs=[tg.InferRequestedOutput("y")])
    assert_same(result.as_numpy("y"), np.full((3, 4), 2.0, np.float32))
    assert result.as_numpy("t") is None and result.get_response().id == "r-7"


def test_bad_requests_are_invalid_argument_naming_the_tensor(served: InferenceServer) -> None:
    client = tg.InferenceServerClient(target(served))
    wrong = grpc_inputs({"x": np.ones((1, 4), np.float64), "s": np.array([b"a", b"b"], dtype=object)},
                        {"x": "FP64", "s": "BYTES"})
    with pytest.raises(InferenceServerException, match="input 'x' expects datatype FP32, got FP64") as caught:
        client.infer("scale", wrong)
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    with pytest.raises(InferenceServerException, match="unknown output 'zz'"):
        client.infer("scale", scale_inputs(np.ones((1, 4), np.float32)), outputs=[tg.InferRequestedOutput("zz")])
    assert client.infer("scale", scale_inputs(np.ones((1, 4), np.float32))).as_numpy("y") is not None


def channel_infer(server: InferenceServer, request: pb.ModelInferRequest) -> pb.ModelInferResponse:
    with grpc.insecure_channel(target(server)) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                   request_serializer=pb.ModelInferRequest.SerializeToString,
                                   response_deserializer=pb.ModelInferResponse.FromString)
        response: pb.ModelInferResponse = call(request, timeout=30)
        return response


def test_typed_contents_are_accepted_as_well_as_raw(served: InferenceServer) -> None:
    request = pb.ModelInferRequest(model_name="scale", inputs=[
        pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=[1, 4],
                                              contents=pb.InferTensorContents(fp32_contents=[1, 2, 3, 4])),
        pb.ModelInferRequest.InferInputTensor(name="s", datatype="BYTES", shape=[2],
                                              contents=pb.InferTensorContents(bytes_contents=[b"a", b"b"]))])
    response = channel_infer(served, request)
    names = [o.name for o in response.outputs]
    y = np.frombuffer(response.raw_output_contents[names.index("y")], np.float32)
    assert y.tolist() == [2, 4, 6, 8] and list(response.outputs[names.index("y")].shape) == [1, 4]
    request.inputs[0].contents.fp32_contents.append(5)
    with pytest.raises(grpc.RpcError, match="input 'x' has 5 elements in fp32_contents; shape \\[1, 4\\] needs 4"):
        channel_infer(served, request)


def test_asyncio_client(served: InferenceServer) -> None:
    async def run() -> tuple[bool, np.ndarray | None]:
        client = tg_aio.InferenceServerClient(target(served))
        try:
            live = await client.is_server_live()
            result = await client.infer("scale", scale_inputs(np.full((2, 4), 3, np.float32)))
            return live, result.as_numpy("y")
        finally:
            await client.close()

    live, y = asyncio.run(run())
    assert live
    assert_same(y, np.full((2, 4), 6, np.float32))


def test_streaming_answers_each_request_and_an_error_does_not_end_the_stream(served: InferenceServer) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = tg.InferenceServerClient(target(served))
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer("scale", scale_inputs(np.ones((1, 4), np.float32)), request_id="a")
        bad = grpc_inputs({"x": np.ones((1, 4), np.float32)}, {"x": "FP32"})
        bad.append(tg.InferInput("nope", [1], "FP32"))
        bad[-1].set_data_from_numpy(np.ones(1, np.float32))
        client.async_stream_infer("scale", bad, request_id="b")
        client.async_stream_infer("scale", scale_inputs(np.full((1, 4), 5, np.float32)), request_id="c")
        got = [answers.get(timeout=30) for _ in range(3)]
    finally:
        client.stop_stream()
    (first, e1), (_, e2), (third, e3) = got
    assert e1 is None and e3 is None and e2 is not None and "unknown input 'nope'" in str(e2)
    assert first.get_response().id == "a" and first.as_numpy("y").tolist() == [[2, 2, 2, 2]]
    assert third.get_response().id == "c" and third.as_numpy("y").tolist() == [[10, 10, 10, 10]]


def test_a_message_over_max_request_bytes_is_resource_exhausted(tmp_path: Path) -> None:
    registry = ModelRegistry()
    registry.publish("scale", "1", ort_runner(scale_model(tmp_path / "s.onnx", 2.0)))
    server = InferenceServer(registry, http=HttpLimits(max_request_bytes=10_000), grpc_port=0)
    server.start()
    try:
        client = tg.InferenceServerClient(target(server))
        with pytest.raises(InferenceServerException) as caught:
            client.infer("scale", scale_inputs(np.ones((1000, 4), np.float32)))  # 16 KB of x
        assert caught.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        assert client.infer("scale", scale_inputs(np.ones((10, 4), np.float32))).as_numpy("y") is not None
    finally:
        server.stop()
        registry.close()


def test_a_request_over_the_inflight_budget_is_resource_exhausted(tmp_path: Path) -> None:
    registry = ModelRegistry()
    registry.publish("scale", "1", ort_runner(scale_model(tmp_path / "s.onnx", 2.0)))
    server = InferenceServer(registry, limits=ServingLimits(max_inflight_bytes=5_000), grpc_port=0)
    server.start()
    try:
        client = tg.InferenceServerClient(target(server))
        with pytest.raises(InferenceServerException, match="in-flight limit is 5000") as caught:
            client.infer("scale", scale_inputs(np.ones((1000, 4), np.float32)))
        assert caught.value.status() == "StatusCode.RESOURCE_EXHAUSTED" and server.budget.used == 0
        assert client.infer("scale", scale_inputs(np.ones((10, 4), np.float32))).as_numpy("y") is not None
    finally:
        server.stop()
        registry.close()


def test_grpc_and_http_share_one_byte_budget(tmp_path: Path) -> None:
    registry = ModelRegistry()
    registry.publish("scale", "1", ort_runner(scale_model(tmp_path / "s.onnx", 2.0)))
    server = InferenceServer(registry, limits=ServingLimits(max_inflight_bytes=100_000), grpc_port=0)
    server.start()
    try:
        with socket.create_connection(("127.0.0.1", server.port)) as slow:  # an HTTP body that holds 9000 x 9 bytes
            slow.sendall(b"POST /v2/models/scale/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 9000\r\n\r\n{")
            deadline = time.monotonic() + 5
            while server.budget.used < 81_000 and time.monotonic() < deadline:
                time.sleep(0.02)
            client = tg.InferenceServerClient(target(server))
            with pytest.raises(InferenceServerException, match="too many bytes in flight") as caught:
                client.infer("scale", scale_inputs(np.ones((2000, 4), np.float32)))  # 32 KB: fits alone, not now
            assert caught.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        deadline = time.monotonic() + 5
        while server.budget.used and time.monotonic() < deadline:
            time.sleep(0.02)
        assert client.infer("scale", scale_inputs(np.ones((2000, 4), np.float32))).as_numpy("y") is not None
    finally:
        server.stop()
        registry.close()


def test_grpc_and_http_share_one_queue(tmp_path: Path) -> None:
    registry = ModelRegistry()
    gated = GatedRunner(ort_runner(scale_model(tmp_path / "g.onnx", 2.0)))
    registry.publish("scale", "1", gated)
    server = InferenceServer(registry, limits=ServingLimits(workers=1, max_queue=1), grpc_port=0)
    server.start()
    statuses: list[int] = []

    def over_http() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        conn.request("POST", "/v2/models/scale/infer", body=infer_body())
        statuses.append(conn.getresponse().status)

    try:
        held = [threading.Thread(target=over_http) for _ in range(2)]
        for t in held:
            t.start()
        assert gated.entered.acquire(timeout=10)  # one runs, one waits: the queue is full
        time.sleep(0.2)
        client = tg.InferenceServerClient(target(server))
        with pytest.raises(InferenceServerException, match="inference queue is full") as caught:
            client.infer("scale", scale_inputs(np.ones((1, 4), np.float32)))
        assert caught.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        gated.gate.set()
        for t in held:
            t.join(20)
        assert statuses == [200, 200]
        assert client.infer("scale", scale_inputs(np.ones((1, 4), np.float32))).as_numpy("y") is not None
    finally:
        gated.gate.set()
        server.stop()
        registry.close()


def test_bearer_token_in_metadata_guards_all_but_health(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret-token-0123456789\n")
    token.chmod(0o600)
    registry = ModelRegistry()
    registry.publish("scale", "1", ort_runner(scale_model(tmp_path / "s.onnx", 2.0)))
    settings = InferenceSettings(host="0.0.0.0", port=0, grpc_port=0, token_file=token, memory_limit_mb=0)
    server = InferenceServer.from_settings(registry, settings)
    server.start()
    try:
        client = tg.InferenceServerClient(f"127.0.0.1:{target(server).rsplit(':', 1)[1]}")
        assert client.is_server_live() and client.is_server_ready()
        calls: list[Callable[[dict[str, str]], Any]] = [
            lambda h: client.get_model_metadata("scale", headers=h),
            lambda h: client.infer("scale", scale_inputs(np.ones((1, 4), np.float32)), headers=h)]
        for call in calls:
            for headers in ({}, {"authorization": "Bearer wrong-token-0123456789"}):
                with pytest.raises(InferenceServerException, match="missing or wrong bearer token") as caught:
                    call(headers)
                assert caught.value.status() == "StatusCode.UNAUTHENTICATED"
            assert call({"authorization": "Bearer s3cret-token-0123456789"}) is not None
    finally:
        server.stop()
        registry.close()


def test_mutual_tls_needs_a_client_certificate_from_the_ca(tmp_path: Path) -> None:
    pki = FleetPki.init(tmp_path / "pki", Algorithm.P256)
    files = {}
    for name, usage, hosts in (("server", Usage.SERVER, ["127.0.0.1"]), ("client", Usage.CLIENT, [])):
        identity = pki.issue(name, usage, 1, hosts)
        files[name] = (tmp_path / f"{name}.pem", tmp_path / f"{name}.key")
        files[name][0].write_bytes(identity.cert_pem)
        files[name][1].write_bytes(identity.key_pem)
    server = InferenceServer(ModelRegistry(), host="0.0.0.0", tls=TlsFiles(*files["server"], pki.ca_cert_path), grpc_port=0)
    server.start()
    try:
        address = f"127.0.0.1:{target(server).rsplit(':', 1)[1]}"
        anonymous = tg.InferenceServerClient(address, ssl=True, root_certificates=str(pki.ca_cert_path))
        with pytest.raises(InferenceServerException):
            anonymous.is_server_live(client_timeout=10)
        client = tg.InferenceServerClient(address, ssl=True, root_certificates=str(pki.ca_cert_path),
                                          private_key=str(files["client"][1]), certificate_chain=str(files["client"][0]))
        assert client.is_server_live(client_timeout=10)
    finally:
        server.stop()


def test_grpc_port_without_grpcio_is_a_config_error_naming_the_extra() -> None:
    """A process where ``import grpc`` fails (as on an agent installed without the grpc extra)."""
    code = ("import sys; sys.modules['grpc'] = None\n"
            "from agent.config import InferenceSettings\nfrom agent.serving import InferenceServer, ModelRegistry\n"
            "from edgecore.errors import ConfigError\n"
            "try:\n    InferenceServer.from_settings(ModelRegistry(), InferenceSettings(port=0, grpc_port=0))\n"
            "except ConfigError as exc:\n    print(exc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=checkout_env(),
                         timeout=60)
    assert "inference.grpc_port is set but gRPC cannot be served" in out.stdout, out.stderr
    assert "pip install 'edgectl[grpc]'" in out.stdout


def test_committed_messages_match_the_proto(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools (test extra) regenerates the messages")
    oip = ROOT / "agent" / "serving" / "oip"
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{oip}", f"--python_out={tmp_path}",
                    f"--pyi_out={tmp_path}", str(oip / "inference.proto")], check=True, timeout=60)
    # The messages are the serialized descriptor; the rest of the .py names protoc's version, which moves with
    # grpcio-tools, and needs a protobuf runtime at least that new (so the committed one is kept at 6.33.5).
    fresh, committed = ((folder / "inference_pb2.py").read_text() for folder in (tmp_path, oip))
    assert _descriptor(fresh) == _descriptor(committed), "regenerate inference_pb2.py: see inference.proto"
    assert (tmp_path / "inference_pb2.pyi").read_text() == (oip / "inference_pb2.pyi").read_text(), \
        "regenerate inference_pb2.pyi: see inference.proto"


def _descriptor(generated: str) -> str:
    found = re.search(r"AddSerializedFile\((b'.*?')\)", generated)
    assert found is not None, "protoc's output has no serialized descriptor"
    return found.group(1)


def test_metadata_shapes_match_http(served: InferenceServer) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=10)
    conn.request("GET", "/v2/models/scale")
    over_http = json.loads(conn.getresponse().read())
    over_grpc = tg.InferenceServerClient(target(served)).get_model_metadata("scale")
    assert [(t.name, t.datatype, list(t.shape)) for t in over_grpc.inputs] == \
        [(t["name"], t["datatype"], t["shape"]) for t in over_http["inputs"]]
