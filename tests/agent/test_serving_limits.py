"""The inference server under hostile load: slowloris, 200 concurrent clients, memory and queue bounds."""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from agent.serving import InferenceServer, ModelRegistry
from agent.serving.http11 import HttpLimits
from agent.serving.server import ServingLimits
from edgecore.backends import Runner
from tests.agent.test_serving import ort_runner, scale_model

ROOT = Path(__file__).resolve().parents[2]


class GatedRunner(Runner):
    """An explicit seam: a real ORT runner whose inferences wait until the test opens the gate."""

    def __init__(self, inner: Runner) -> None:
        super().__init__(inner.name)
        self.inner = inner
        self.gate = threading.Event()
        self.entered = threading.Semaphore(0)

    def activate_impl(self) -> None:
        self.inner.activate()

    def deactivate_impl(self) -> None:
        self.inner.deactivate()

    def inputs_impl(self) -> Any:
        return self.inner.inputs

    def outputs_impl(self) -> Any:
        return self.inner.outputs

    def placement_impl(self) -> Any:
        return self.inner.placement

    def infer_impl(self, feeds: Mapping[str, np.ndarray]) -> dict[str, Any]:
        self.entered.release()
        self.gate.wait(10)
        return self.inner.infer(feeds)


def start(registry: ModelRegistry, **kw: Any) -> InferenceServer:
    http_kw = {k: kw.pop(k) for k in list(kw) if k in HttpLimits.__dataclass_fields__}
    server = InferenceServer(registry, http=HttpLimits(**http_kw), limits=ServingLimits(**kw))
    server.start()
    return server


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[ModelRegistry]:
    reg = ModelRegistry()
    reg.publish("scale", "1", ort_runner(scale_model(tmp_path / "s.onnx", 2.0)))
    yield reg
    reg.close()


def infer_body(rows: int = 1) -> bytes:
    return json.dumps({"inputs": [
        {"name": "x", "datatype": "FP32", "shape": [rows, 4], "data": [1.0] * (4 * rows)},
        {"name": "s", "datatype": "BYTES", "shape": [2], "data": ["a", "b"]},
    ]}).encode()


def call(port: int, body: bytes = b"", method: str = "POST", path: str = "/v2/models/scale/infer",
         headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any], http.client.HTTPResponse]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request(method, path, body=body or None, headers=headers or {})
    response = conn.getresponse()
    payload = response.read()
    conn.close()
    is_json = response.getheader("Content-Type") == "application/json"
    return response.status, json.loads(payload) if is_json else {}, response


def test_slowloris_holds_no_threads_and_is_cut_at_the_header_timeout(registry: ModelRegistry) -> None:
    server = start(registry, header_timeout_s=1.5)
    try:
        threads_before = threading.active_count()
        socks = []
        for _ in range(1000):
            s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            s.sendall(b"POST /v2/models/scale/infer HTTP/1.1\r\nHost: x\r\n")  # never the blank line
            socks.append(s)
        time.sleep(0.3)
        assert threading.active_count() <= threads_before + 4  # the worker pool at most, not 1000
        status, body, _ = call(server.port, infer_body())
        assert status == 200 and body["outputs"][0]["data"] == [2.0] * 4
        time.sleep(1.6)
        answers = []
        for s in socks[:20]:
            s.settimeout(5)
            answers.append(s.recv(200))
        assert all(a.startswith(b"HTTP/1.1 408") for a in answers), answers[:3]
    finally:
        for s in socks:
            s.close()
        server.stop()


def test_200_concurrent_clients_get_answers_or_503_and_no_reset(registry: ModelRegistry) -> None:
    server = start(registry, workers=2, max_queue=4)
    statuses: list[int] = []
    failures: list[BaseException] = []
    barrier = threading.Barrier(200)

    def client() -> None:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
            conn.connect()
            barrier.wait(30)
            for _ in range(3):
                conn.request("POST", "/v2/models/scale/infer", body=infer_body(64))
                response = conn.getresponse()
                payload = response.read()
                statuses.append(response.status)
                if response.status == 503:
                    assert response.getheader("Retry-After") == "1" and b"retry later" in payload
            conn.close()
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=client) for _ in range(200)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        server.stop()
    assert failures == [] and len(statuses) == 600
    assert set(statuses) <= {200, 503} and statuses.count(200) > 0


def test_full_queue_answers_503_and_drains(tmp_path: Path) -> None:
    registry = ModelRegistry()
    gated = GatedRunner(ort_runner(scale_model(tmp_path / "g.onnx", 2.0)))
    registry.publish("scale", "1", gated)
    server = start(registry, workers=1, max_queue=1)
    results: list[int] = []
    try:
        held = [threading.Thread(target=lambda: results.append(call(server.port, infer_body())[0])) for _ in range(2)]
        for t in held:
            t.start()
        assert gated.entered.acquire(timeout=10)  # one runs, one waits in the queue
        time.sleep(0.2)
        status, body, response = call(server.port, infer_body())
        assert status == 503 and body["error"] == "inference queue is full; retry later"
        assert response.getheader("Retry-After") == "1"
        gated.gate.set()
        for t in held:
            t.join(20)
        assert results == [200, 200] and call(server.port, infer_body())[0] == 200
    finally:
        gated.gate.set()
        server.stop()
        registry.close()


def test_inflight_budget_refuses_with_503_while_a_slow_body_holds_it(registry: ModelRegistry) -> None:
    server = start(registry, max_inflight_bytes=100_000, body_timeout_s=1.0)
    try:
        slow = socket.create_connection(("127.0.0.1", server.port))
        slow.sendall(b"POST /v2/models/scale/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 9000\r\n\r\n{")  # reserves 9000 x 9
        time.sleep(0.2)
        assert server.budget.used == 81_000
        status, body, _ = call(server.port, infer_body(200))
        assert status == 503 and body["error"] == "too many bytes in flight; retry later"
        time.sleep(1.2)  # the slow body times out: its reservation comes back
        assert server.budget.used == 0
        assert call(server.port, infer_body(200))[0] == 200
        slow.close()
    finally:
        server.stop()


def test_json_that_can_never_fit_is_413_and_the_connection_closes_cleanly(registry: ModelRegistry) -> None:
    server = start(registry, max_inflight_bytes=50_000)
    try:
        status, body, response = call(server.port, infer_body(300))
        assert status == 413 and "JSON counts 8x" in body["error"] and "in-flight limit is 50000" in body["error"]
        assert response.getheader("Connection") == "close"
        assert call(server.port, infer_body(10))[0] == 200
    finally:
        server.stop()


def test_outputs_forecast_above_the_cap_are_refused_before_running(registry: ModelRegistry) -> None:
    server = start(registry, max_response_bytes=1000)
    try:
        status, body, _ = call(server.port, infer_body(100))  # y is [100, 4] float32: 1600 bytes
        assert status == 400 and body["error"].startswith("outputs would be 1600 bytes ('y' alone 1600)")
        assert registry.telemetry()["scale"]["errors"] == 1
        assert call(server.port, infer_body(10))[0] == 200
    finally:
        server.stop()


def fill_model(path: Path) -> Path:
    """ConstantOfShape(dims): the input's values, not its shape, decide the output size."""
    graph = helper.make_graph(
        [helper.make_node("ConstantOfShape", ["dims"], ["y"], value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0]))],
        "fill", [helper.make_tensor_value_info("dims", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


_MEMORY_SERVER = """
import sys, time
from pathlib import Path
from agent.catalog import Candidate
from agent.serving import InferenceServer, ModelRegistry
registry = ModelRegistry()
registry.publish("fill", "1", Candidate("onnxruntime", "CPUExecutionProvider").open(Path(sys.argv[1])))
server = InferenceServer(registry, memory_limit_mb=int(sys.argv[2]))
server.start()
print(server.port, flush=True)
sys.stdin.read()
"""


def test_a_request_that_allocates_past_the_cap_fails_and_the_process_lives(tmp_path: Path) -> None:
    vsz_mib = _vsz_mib_of_fresh_server(tmp_path)
    proc = subprocess.Popen([sys.executable, "-c", _MEMORY_SERVER, str(fill_model(tmp_path / "f.onnx")), str(vsz_mib + 1024)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())

        def ask(dims: list[int]) -> bytes:
            return json.dumps({"inputs": [{"name": "dims", "datatype": "INT64", "shape": [2], "data": dims}],
                               "parameters": {"binary_data_output": True}}).encode()

        status, body, _ = call(port, ask([32768, 16384]), path="/v2/models/fill/infer")  # 2 GiB of float32
        assert status == 500 and "ran out of memory" in body["error"]
        statuses = [call(port, ask([4, 4]), path="/v2/models/fill/infer")[0] for _ in range(3)]
        assert statuses == [200, 200, 200] and proc.poll() is None, statuses
        # The runner renewed its session: the old arena, sized for the refused 2 GiB, would have
        # reserved most of the address space left under the cap on the next small request.
        assert mapped_mib(proc.pid) < vsz_mib + 512, (mapped_mib(proc.pid), vsz_mib)
    finally:
        proc.kill()
        proc.wait(10)


def _vsz_mib_of_fresh_server(tmp_path: Path) -> int:
    """Address space a server process maps before its first request (the cap sits 1 GiB above)."""
    proc = subprocess.Popen([sys.executable, "-c", _MEMORY_SERVER, str(fill_model(tmp_path / "v.onnx")), "0"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        call(port, json.dumps({"inputs": [{"name": "dims", "datatype": "INT64", "shape": [2], "data": [2, 2]}]}).encode(),
             path="/v2/models/fill/infer")
        return mapped_mib(proc.pid)
    finally:
        proc.kill()
        proc.wait(10)


def mapped_mib(pid: int) -> int:
    """The address space process ``pid`` maps now (VmSize), in MiB."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmSize:"))) // 1024



def test_listen_backlog_is_at_least_128(registry: ModelRegistry) -> None:
    if shutil.which("ss") is None:
        pytest.skip("ss (iproute2) is not installed: cannot read the listen backlog")
    server = start(registry)
    try:
        line = subprocess.run(["ss", "-ltnH", f"sport = :{server.port}"], capture_output=True, text=True, check=True).stdout
        assert int(line.split()[2]) >= 128, line  # Send-Q of a listening socket is its backlog
    finally:
        server.stop()


def test_the_header_limit_holds_again_after_a_large_body_on_the_same_connection(registry: ModelRegistry) -> None:
    """A body is read with a raised reader limit (no flow-control pauses); the next request's headers are capped again."""
    server = start(registry, max_header_bytes=16 * 1024)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        big = infer_body(40_000)  # ~700 KB of JSON: the reader's limit is raised while it arrives
        conn.request("POST", "/v2/models/scale/infer", body=big)
        first = conn.getresponse()
        assert first.status == 200 and len(json.loads(first.read())["outputs"][0]["data"]) == 160_000
        conn.request("POST", "/v2/models/scale/infer", body=infer_body(), headers={"X-Pad": "a" * 100_000})
        second = conn.getresponse()
        assert second.status == 431 and "request headers exceed 16384 bytes" in json.loads(second.read())["error"]
        conn.close()
    finally:
        server.stop()
