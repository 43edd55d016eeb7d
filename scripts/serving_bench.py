"""The agent's serving paths measured side by side (``./scripts/bench agent --only serving``; bench_agent.py part 3).

- Overhead at 1 client: in-process ``runner.infer`` against HTTP binary, HTTP JSON and gRPC calls of
  the same model in a server process, and HTTP binary to the server as it was before llhttp,
  interleaved call by call; a small request (1x4 float32) and a 600 KB one (1x3x224x224 float32
  through a global pool, so that the API cost shows).
- Load: throughput and p50/p99 at 1, 8 and 64 clients of each path on a 1x3x224x224 conv backbone,
  against in-process calls on as many threads as the server has workers; CPU ms per answered
  request of the server process.
- The HTTP layer apart (serving_http.py): pipelined throughput before and after the parser change,
  ab/wrk/h2load, parser cost per head.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import onnx
import psutil
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from serving_http import h2load, old_server_package, parser_costs, pipelined, tools  # noqa: E402

from agent.serving.oip import inference_pb2 as pb  # noqa: E402
from agent.serving.pool import ServingLimits  # noqa: E402
from edgecore.backends.onnxruntime import OrtRunner, OrtSessionLoader  # noqa: E402
from tests.checkout import checkout_env  # noqa: E402

__all__ = ["LEVELS", "Payload", "ServingReport", "measure_serving", "tiny_model"]

LEVELS = (1, 8, 64)
WORKERS = ServingLimits().workers
# One intra-op thread for every session of the run, in the servers and in process: onnxruntime's pools
# spin a while after each inference, and on 2 cores one process's spinning pool slows the next call of another.
ONNXRUNTIME_THREADS = 1
GRPC_METHOD = "/inference.GRPCInferenceService/ModelInfer"
HEALTH = "/v2/health/live"

_SERVER = """
import sys
from pathlib import Path
from agent.serving import InferenceServer, ModelRegistry
from edgecore.backends.onnxruntime import OrtRunner, OrtSessionLoader
registry = ModelRegistry()
for spec in sys.argv[1:]:
    name, path = spec.split("=", 1)
    registry.publish(name, "1", OrtRunner(OrtSessionLoader(Path(path), intra_op_threads=1)), {})
import psutil, threading
runtime = [t.id for t in psutil.Process().threads() if t.id != threading.get_native_id()]  # onnxruntime's own
server = InferenceServer(registry, max_request_bytes=8 * 2**20, grpc_port=0)
server.start()
print(server.port, server.grpc.port, *runtime, flush=True)
sys.stdin.read()
"""

# The whole HTTP server as it was at OLD_HTTP11 (its server.py and http11.py from git, in a package of their own).
_OLD_SERVER = """
import sys
from pathlib import Path
from agent.serving import ModelRegistry
from edgecore.backends.onnxruntime import OrtRunner, OrtSessionLoader
from old_serving.server import InferenceServer
registry = ModelRegistry()
for spec in sys.argv[1:]:
    name, path = spec.split("=", 1)
    registry.publish(name, "1", OrtRunner(OrtSessionLoader(Path(path), intra_op_threads=1)), {})
import psutil, threading
runtime = [t.id for t in psutil.Process().threads() if t.id != threading.get_native_id()]  # onnxruntime's own
server = InferenceServer(registry, max_request_bytes=8 * 2**20)
server.start()
print(server.port, 0, *runtime, flush=True)
sys.stdin.read()
"""

def _save(nodes: list[onnx.NodeProto], shape_in: list[int], shape_out: list[int], path: Path,
          inits: list[onnx.TensorProto] | None = None) -> Path:
    graph = helper.make_graph(nodes, path.stem, [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape_in)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape_out)], inits or [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def tiny_model(path: Path) -> Path:
    """y = x + x on 1x4 float32: a 16-byte request."""
    return _save([helper.make_node("Add", ["x", "x"], ["y"])], [1, 4], [1, 4], path)


@dataclass
class Payload:
    """One model's request in every encoding, built once so that clients spend no time on it."""

    model: str
    x: np.ndarray
    binary: bytes = b""
    binary_header: int = 0
    json_body: bytes = b""
    grpc_request: bytes = b""

    def __post_init__(self) -> None:
        tensor: dict[str, Any] = {"name": "x", "datatype": "FP32", "shape": list(self.x.shape)}
        header = json.dumps({"inputs": [{**tensor, "parameters": {"binary_data_size": self.x.nbytes}}],
                             "parameters": {"binary_data_output": True}}).encode()
        self.binary, self.binary_header = header + self.x.tobytes(), len(header)
        self.json_body = json.dumps({"inputs": [{**tensor, "data": self.x.reshape(-1).tolist()}]}).encode()
        self.grpc_request = pb.ModelInferRequest(model_name=self.model, inputs=[pb.ModelInferRequest.InferInputTensor(
            name="x", datatype="FP32", shape=list(self.x.shape))], raw_input_contents=[self.x.tobytes()]).SerializeToString()


class Busy(Exception):
    """503 or RESOURCE_EXHAUSTED: the server's back-pressure, counted apart from failures."""


@dataclass
class Server:
    """The agent's server in its own process, as on a device."""

    process: subprocess.Popen[str]
    http_port: int
    grpc_port: int
    runtime_threads: frozenset[int] = frozenset()

    @property
    def cpu_s(self) -> float:
        """CPU seconds of the server's own threads: onnxruntime's thread pools, which spin a while after each
        inference whoever asked for it, are left out."""
        threads = psutil.Process(self.process.pid).threads()
        return float(sum(t.user_time + t.system_time for t in threads if t.id not in self.runtime_threads))


@contextmanager
def agent_server(models: dict[str, Path], old: Path | None = None) -> Iterator[Server]:
    """This checkout's server (HTTP and gRPC) or, with ``old`` (from ``old_server_package``), the HTTP server of OLD_HTTP11."""
    env = checkout_env() if old is None else checkout_env(None, PYTHONPATH=str(old))
    proc = subprocess.Popen([sys.executable, "-c", _SERVER if old is None else _OLD_SERVER,
                             *(f"{k}={v}" for k, v in models.items())], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None and proc.stdin is not None
    http_port, grpc_port, *runtime = map(int, proc.stdout.readline().split())
    try:
        yield Server(proc, http_port, grpc_port, frozenset(runtime))
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


# -- the calls ------------------------------------------------------------------------------------

Call = Callable[[Any], None]
Setup = Callable[[], Any]


def http_binary(server: Server, payload: Payload) -> tuple[Setup, Call]:
    headers = {"Inference-Header-Content-Length": str(payload.binary_header), "Content-Type": "application/octet-stream"}
    return _http(server, payload.model, payload.binary, headers)


def http_json(server: Server, payload: Payload) -> tuple[Setup, Call]:
    return _http(server, payload.model, payload.json_body, {"Content-Type": "application/json"})


def _http(server: Server, model: str, body: bytes, headers: dict[str, str]) -> tuple[Setup, Call]:
    path = f"/v2/models/{model}/infer"

    def setup() -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=120)

    def call(conn: http.client.HTTPConnection) -> None:
        conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        response.read()
        if response.status == 503:
            raise Busy
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}")

    return setup, call


def grpc_raw(server: Server, payload: Payload) -> tuple[Setup, Call]:
    """Unary ModelInfer with the request serialized once (no serializer: grpc sends the bytes as they are)."""
    def setup() -> Any:
        channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
        return channel.unary_unary(GRPC_METHOD)

    def call(stub: Any) -> None:
        try:
            pb.ModelInferResponse.FromString(stub(payload.grpc_request, timeout=120))
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise Busy from None
            raise

    return setup, call


def in_process(path: Path, payload: Payload) -> tuple[Setup, Call, Callable[[], None]]:
    runner = OrtRunner(OrtSessionLoader(path, intra_op_threads=ONNXRUNTIME_THREADS))
    runner.activate()
    feeds = {"x": payload.x}

    def call(_: Any) -> None:
        runner.infer(feeds, check=False)

    return (lambda: None), call, runner.close


# -- overhead at one client -----------------------------------------------------------------------

def overhead(paths: dict[str, Callable[[], None]], seconds: float, windows: int = 6) -> dict[str, dict[str, float]]:
    """p50/p99 ms of each call, interleaved call by call for ``seconds``, and the lowest p50 of ``windows`` equal windows.

    Other jobs' load comes in bursts: the quietest window's p50 is the closest this machine gets to an idle one.
    """
    samples: dict[str, list[list[float]]] = {name: [] for name in paths}
    for fn in paths.values():
        for _ in range(30):
            fn()
    for _ in range(windows):
        for runs in samples.values():
            runs.append([])
        deadline = time.perf_counter() + seconds / windows
        while time.perf_counter() < deadline:
            for name, fn in paths.items():
                start = time.perf_counter()
                fn()
                samples[name][-1].append(time.perf_counter() - start)
    figures = {}
    for name, runs in samples.items():
        every = [t for run in runs for t in run]
        figures[name] = {"p50_ms": float(np.median(every)) * 1000, "p99_ms": float(np.percentile(every, 99)) * 1000,
                         "quiet_p50_ms": min(float(np.median(run)) for run in runs) * 1000, "runs": len(every)}
    return figures


def cpu_per_call(paths: dict[str, Callable[[], None]], servers: dict[str, Server], calls: int) -> dict[str, dict[str, float]]:
    """CPU ms per call of this process (the client, or the in-process runtime) and of the path's server, each path alone.

    Unlike wall time, CPU time hardly moves with other jobs' load: on an idle machine a call's latency
    is about the client's and the server's CPU plus the loopback wake-ups between them.
    """
    figures = {}
    for name, fn in paths.items():
        server = servers.get(name)
        client, served = time.process_time(), server.cpu_s if server is not None else 0.0
        for _ in range(calls):
            fn()
        figures[name] = {"client_cpu_ms": 1000 * (time.process_time() - client) / calls,
                         "server_cpu_ms": 1000 * (server.cpu_s - served) / calls if server is not None else 0.0}
    return figures


def bound(setup: Setup, call: Call) -> Callable[[], None]:
    state = setup()
    return lambda: call(state)


# -- load -----------------------------------------------------------------------------------------

@dataclass
class Outcome:
    ok: int = 0
    busy: int = 0
    failed: int = 0
    latencies: list[float] = field(default_factory=list)


def hammer(clients: int, seconds: float, setup: Setup, call: Call) -> dict[str, Any]:
    """``clients`` threads calling for ``seconds``: req/s, p50/p99, back-pressure and failures."""
    outcome, lock = Outcome(), threading.Lock()
    start_line = threading.Barrier(clients + 1)
    deadline = [0.0]

    def worker() -> None:
        state = setup()
        start_line.wait()
        while time.perf_counter() < deadline[0]:
            t0 = time.perf_counter()
            try:
                call(state)
                kind = "ok"
            except Busy:
                kind = "busy"
                time.sleep(0.02)  # the server said Retry-After: do not spin on it
            except Exception:
                kind, state = "failed", setup()
            with lock:
                setattr(outcome, kind, getattr(outcome, kind) + 1)
                if kind == "ok":
                    outcome.latencies.append(time.perf_counter() - t0)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    deadline[0] = time.perf_counter() + seconds
    start_line.wait()
    for t in threads:
        t.join(seconds + 120)
    lat = np.array(outcome.latencies or [float("nan")]) * 1000
    return {"rps": outcome.ok / seconds, "p50_ms": float(np.median(lat)), "p99_ms": float(np.percentile(lat, 99)),
            "ok": outcome.ok, "busy": outcome.busy, "failed": outcome.failed}


def load_rows(server: Server, conv: Path, payload: Payload, seconds: float, work: Path) -> list[dict[str, Any]]:
    """Each path at each client count, the paths interleaved within a count.

    The clients are threads of this process and share its GIL: ``http.client`` parses answers in
    Python, grpc in C. The same binary requests also come from h2load (C, one process), which shows
    what the server does when its clients cost it nothing.
    """
    body = work / "conv.bin"
    body.write_bytes(payload.binary)
    url = f"http://127.0.0.1:{server.http_port}/v2/models/{payload.model}/infer"
    h2_post = ["-d", str(body), "-H", f"Inference-Header-Content-Length: {payload.binary_header}",
               "-H", "Content-Type: application/octet-stream"]
    setup_in, call_in, close = in_process(conv, payload)
    endpoints = {"HTTP JSON": http_json(server, payload), "HTTP binary": http_binary(server, payload),
                 "gRPC": grpc_raw(server, payload)}
    rows = []
    try:
        for clients in LEVELS:
            threads = min(clients, WORKERS)
            row: dict[str, Any] = {"clients": clients, "in-process": hammer(threads, seconds, setup_in, call_in)}
            for name, (setup, call) in endpoints.items():
                before = server.cpu_s
                row[name] = hammer(clients, seconds, setup, call)
                row[name]["server_cpu_ms"] = 1000 * (server.cpu_s - before) / max(row[name]["ok"], 1)
            if shutil.which("h2load") is not None:
                before = server.cpu_s
                got = h2load(url, 0, clients, 1, h2_post, seconds=seconds)
                ok = got["done"] - got["failed"] - got["non_2xx"]
                row["HTTP binary (h2load)"] = {"rps": got["rps"], "p50_ms": float("nan"), "p99_ms": float("nan"),
                                               "mean_ms": got["mean_ms"], "ok": ok, "busy": got["non_2xx"],
                                               "failed": got["failed"],
                                               "server_cpu_ms": 1000 * (server.cpu_s - before) / max(ok, 1)}
            rows.append(row)
            print(f"  {clients:3d} clients: " + " | ".join(
                f"{name} {fig['rps']:.1f}/s p50 {fig['p50_ms']:.2f} p99 {fig['p99_ms']:.2f} ms"
                + (f" busy {fig['busy']} failed {fig['failed']}" if name != "in-process" else "")
                for name, fig in row.items() if name != "clients"))
    finally:
        close()
    return rows


# -- everything, in one run -----------------------------------------------------------------------

@dataclass
class ServingReport:
    overhead: dict[str, dict[str, dict[str, float]]]
    load: list[dict[str, Any]]
    pipelined: dict[str, Any]
    tools: list[dict[str, Any]]
    parsers: dict[str, float]
    load_average: tuple[float, float]
    seconds: dict[str, float]


def measure_serving(models: dict[str, Path], api_seconds: float, load_seconds: float) -> ServingReport:
    """``models``: ``tiny``, ``pool`` (600 KB through a global pool) and ``conv`` (the 224x224 backbone)."""
    before = os.getloadavg()[0]
    rng = np.random.default_rng(7)
    small = Payload("tiny", np.ones((1, 4), np.float32))
    big = Payload("pool", rng.random((1, 3, 224, 224), dtype=np.float32))
    conv = Payload("conv", big.x)
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory() as tmp, agent_server(models) as server:
        work = Path(tmp)
        old_package = old_server_package(work)
        old = stack.enter_context(agent_server(models, old_package)) if old_package is not None else None
        print("  parser: microseconds per request head")
        parsers = parser_costs(work)
        print("   " + ", ".join(f"{k} {v:.2f}" for k, v in parsers.items()))
        print("  overhead at 1 client, interleaved (p50 ms)")
        costs = {}
        sizes = (("small (1x4 float32)", small, models["tiny"]), ("600 KB (1x3x224x224)", big, models["pool"]))
        for label, payload, path in sizes:
            setup_in, call_in, close = in_process(path, payload)
            calls = {"in-process": bound(setup_in, call_in), "HTTP binary": bound(*http_binary(server, payload)),
                     "gRPC": bound(*grpc_raw(server, payload))}
            if old is not None:
                calls["HTTP binary, server before llhttp"] = bound(*http_binary(old, payload))
            if payload is small:  # 600 KB as JSON is 3 MB of text: its cost shows in the load table, not here
                calls["HTTP JSON"] = bound(*http_json(server, payload))
            costs[label] = overhead(calls, api_seconds)
            servers = {name: server for name in calls if name != "in-process"}
            if old is not None:
                servers["HTTP binary, server before llhttp"] = old
            for name, cpu in cpu_per_call(calls, servers, 2000 if payload is small else 500).items():
                costs[label][name].update(cpu)
            close()
            print(f"   {label}: " + ", ".join(f"{k} {v['p50_ms']:.3f} (CPU {v['client_cpu_ms'] + v['server_cpu_ms']:.3f})"
                                          for k, v in costs[label].items()))
        print(f"  load on the conv backbone ({', '.join(map(str, LEVELS))} clients, {load_seconds:g} s each)")
        rows = load_rows(server, models["conv"], conv, load_seconds, work)
        print("  standard tools against the agent server")
        tool_rows = tools(server.http_port, small.model, small.binary, small.binary_header, work)
        print("  pipelined health checks: old vs new http11 (h2load --h1, 4 connections x 16 in flight)")
        piped = pipelined(work, rounds=5, requests=40000)
        print(f"   {piped.get('median', piped)}")
    return ServingReport(costs, rows, piped, tool_rows, parsers, (before, os.getloadavg()[0]),
                         {"api": api_seconds, "load": load_seconds})
