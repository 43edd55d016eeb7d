"""Model delivery benchmark over one Mosquitto and one HTTP server (``./scripts/bench delivery [--parts ...]``).

1. Fan-out: one ~10 MB signed package to 1 light agent, then to N light agents (edgectl.sim: real
   ChunkFetcher/Download/Ledger/extract_payload, one MQTT connection each), deployed by
   ``edgectl.fleet.direct.deploy_to_devices`` (the path of ``edgectl deploy --device``); wall time
   from the first desired-state publish to every device's final ``done ok`` event. Goal:
   time(N) / time(1) < 2. Beside it, as the floor this one-process harness can reach, the same
   chunks from a raw paho publisher to 1 and to N raw paho subscribers in this process, and the
   CPU seconds of the simulated devices, the controller and Mosquitto during each wave.
2. Controller bytes per wave: ArtifactServer.bytes_sent for the N-agent wave / payload size. Goal <= 1.1.
3. Single-device throughput through the agent path (ArtifactServer -> broker -> ChunkFetcher ->
   Download on disk, hashes checked) against a raw paho QoS 1 publish/subscribe of the same bytes in
   the same chunk size through the same broker. Goal: agent / raw >= 0.8.
4. The agent's HTTP Range download (HttpFetch into a Download) against curl, same file, same
   ``edgectl artifacts serve`` (scripts/bench_http.py). Goal: agent / curl >= 0.8.

Beside 3 and 4, what bounds them, measured in the same run: each path again into a download that
takes the chunks without hashing or writing them, and the CPU time of the duties that only the
agent has (sha256 of every chunk against the signed manifest, the writes, the fsync).
``--parts throughput,http`` measures only 3 and 4 (well under a minute) and prints them without
writing docs/benchmarks.md, which only a run of every part does. ``--baseline REF`` also runs 3 and 4
with edgecore/delivery/download.py and http_fetch.py as at git REF, interleaved: before and after in one run.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import os
import queue
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import psutil
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import paho.mqtt.client as mqtt  # noqa: E402
from bench_http import GOAL as HTTP_GOAL  # noqa: E402
from bench_http import Baseline, Unchecked, median_duties  # noqa: E402
from bench_http import measure as measure_http  # noqa: E402
from benchdoc import machine, write_section  # noqa: E402
from paho.mqtt.enums import CallbackAPIVersion  # noqa: E402

from edgecore.delivery.download import FLUSH_BYTES, Download  # noqa: E402
from edgecore.delivery.fetch import ChunkFetcher  # noqa: E402
from edgecore.protocol import topics  # noqa: E402
from edgecore.protocol.envelope import TrustedKeys  # noqa: E402
from edgecore.protocol.reports import ChunkRequest  # noqa: E402
from edgecore.transport import Message, MqttTransport  # noqa: E402
from edgectl.artifacts.chunk_server import ArtifactServer, ServedArtifact  # noqa: E402
from edgectl.fleet.direct import deploy_to_devices  # noqa: E402
from edgectl.keys import Keyring  # noqa: E402
from edgectl.package import BuildOptions, Package, build_package, read_package  # noqa: E402
from edgectl.sim import SimAgent, SimFleet  # noqa: E402
from tests.brokers import start_mosquitto  # noqa: E402
from tests.pump import InboxPump  # noqa: E402

COMMAND = "./scripts/bench delivery"
FANOUT_GOAL, BYTES_GOAL, THROUGHPUT_GOAL = 2.0, 1.1, 0.8
REPEATS = 15
PARTS = ("waves", "throughput", "http")
CONTROLLER_THREADS = ("MainThread", "artifact-server", "paho-mqtt-client-bench-")  # names (prefixes) of the controller side
DEFAULTS = {k: v.default for k, v in inspect.signature(ArtifactServer).parameters.items()}
PATH = (
    "The path measured: `deploy_to_devices` tells the ArtifactServer which devices it expects, publishes "
    "every desired state and waits once for the broker's acks; the server starts a round as soon as the "
    "last expected device has asked (one device: at once) and publishes each chunk once for the wave, a "
    f"helper thread waiting for the ack of one chunk in {DEFAULTS['window'] // 2} so that at most about "
    f"{DEFAULTS['window'] * 3 // 2} chunks are "
    "unacknowledged and the pipe never runs dry. A device hashes each chunk against the signed manifest "
    f"and writes it with one positioned write into its open `.part` file; every {FLUSH_BYTES >> 20} MiB written are "
    "flushed to disk in the background (one flusher thread per process) while the next chunks arrive, and"
    " the payload is fsynced before it is renamed. It asks again only when no chunk it lacks has arrived "
    "for its request interval (a light agent counts a chunk as arrived when it reaches its network "
    "thread, not when the shared dispatcher gets to it), and marks such requests as repeats, for which "
    f"the server does not resend what it published in the last {DEFAULTS['resend_guard_s']} s. Most of the delay before the "
    "first chunk of the wave of 1 is TCP's: neither paho nor Mosquitto (by default) sets TCP_NODELAY, and"
    " the device's small chunk request, sent right after its event and subscription, can wait for a "
    "delayed ACK."
)
HTTP_PATH = (
    "The HTTP path measured: `HttpFetch` asks for each run of missing chunks with one Range request on one"
    " kept-alive connection and reads the body straight into reused 1 MiB blocks (whole chunks), each chunk under its"
    " own watchdog deadline (the response timeout plus its length at the minimum rate); a second thread takes the"
    " chunks that arrived since its last pass (many at once while it is busy, each as it comes while it keeps up),"
    " checks each against its signed sha256 and writes the good ones with one positioned write; at most three blocks"
    " exist; a bad chunk ends the source with the chunks before it kept. The same background flush and final fsync"
    " as above. curl writes the file and neither checks nor syncs it."
)


def big_model(path: Path, size_mb: float) -> Path:
    """x[1,1024] @ W[1024, k]: a random float32 initializer of about ``size_mb`` MiB."""
    cols = max(1, int(size_mb * 1024 * 1024 / 4 / 1024))
    weight = np.random.default_rng(0).standard_normal((1024, cols)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1024])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, cols])], [numpy_helper.from_array(weight, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


class CpuMeter:
    """CPU seconds of this process split into controller threads and the rest (the light agents), plus the broker's."""

    def __init__(self, broker: psutil.Process) -> None:
        self.broker = broker
        self.me = psutil.Process()
        self._start = self._read()

    def _read(self) -> tuple[float, float, dict[int, float]]:
        names = {t.native_id: t.name for t in threading.enumerate()}
        controller = {t.id: t.user_time + t.system_time for t in self.me.threads()
                      if names.get(t.id, "").startswith(CONTROLLER_THREADS)}
        return sum(self.me.cpu_times()[:2]), sum(self.broker.cpu_times()[:2]), controller

    def stop(self) -> dict[str, float]:
        process, broker, controller = self._read()
        process0, broker0, controller0 = self._start
        ctl = sum(cpu - controller0.get(tid, 0.0) for tid, cpu in controller.items())
        return {"controller": ctl, "devices": process - process0 - ctl, "broker": broker - broker0}


def wave(url: str, fleet: SimFleet, ring: Keyring, package: Package, work: Path, prefix: str,
         count: int, broker: psutil.Process) -> dict[str, Any]:
    """Start ``count`` fresh light agents, deploy to them all as ``edgectl deploy --device`` does, time it; then stop them."""
    agents = [fleet.start(SimAgent(f"{prefix}-{i:03d}", "cpu-x86", work / "sim" / f"{prefix}-{i:03d}")) for i in range(count)]
    for agent in agents:
        assert agent.transport is not None and agent.transport.wait_connected(30), f"{agent.device_id} did not connect"
    time.sleep(1.0)  # let subscriptions settle so the desired state is not raced by SUBACK
    inbox: queue.Queue[Message] = queue.Queue()
    transport = MqttTransport(url, f"bench-wave-{prefix}", inbox=inbox)
    transport.connect()
    server = ArtifactServer(transport).start()  # production defaults
    try:
        cpu = CpuMeter(broker)
        start = time.monotonic()
        _, progress = deploy_to_devices(transport, inbox, package, [a.device_id for a in agents], ring.signing_key("controller"),
                                        timeout_s=150, server=server)
        elapsed = time.monotonic() - start
        used = cpu.stop()
        first = (server.first_sent_at or float("nan")) - start
    finally:
        server.stop()
        transport.close()
        for agent in agents:
            fleet.stop(agent.device_id)
    failed = [f"{p.device_id}: {p.status} {p.detail}" for p in progress.values() if p.status != "ok"]
    if failed:
        raise RuntimeError(f"{len(failed)} device(s) failed: {failed[:3]}")
    return {"seconds": elapsed, "first_chunk": first, "cpu": used, "bytes": server.bytes_sent, "chunks": server.chunks_sent,
            "requests": server.requests}


class BenchController:
    """The controller side of the throughput test: one MQTT connection and an ArtifactServer."""

    def __init__(self, url: str, package: Package) -> None:
        self.inbox: queue.Queue[Message] = queue.Queue()
        self.transport = MqttTransport(url, f"bench-ctl-{uuid.uuid4().hex[:6]}", inbox=self.inbox)
        self.transport.connect()
        self.server = ArtifactServer(self.transport).start()  # production defaults
        m = package.manifest
        self.server.serve(ServedArtifact(m.artifact_id, package.payload, m.payload.chunk_size, len(m.payload.chunks)))
        self._pump = InboxPump(self.inbox, self._handle, "bench-ctl-pump")

    def _handle(self, message: Message) -> None:
        if message.topic.endswith("/chunk-requests"):
            self.server.handle_request(ChunkRequest.from_payload(message.payload))

    def close(self) -> None:
        self._pump.close()
        self.server.stop()
        self.transport.close()


class Timed(Download):
    """The device's download as it is, its finish (the final fsync and the rename) timed for the report."""

    finish_s = 0.0

    def finish(self) -> Path:
        start = time.perf_counter()
        try:
            return super().finish()
        finally:
            self.finish_s = time.perf_counter() - start


def agent_path_transfer(url: str, ctl: BenchController, package: Package, work: Path,
                        kind: type[Download] = Timed) -> tuple[float, float, float, float]:
    """(total, until first chunk, CPU of this process, finish) seconds for one device to fetch the payload with
    ChunkFetcher + ``kind`` (``Unchecked`` for the diagnostic), fsync and rename included."""
    device_id = f"tp-{uuid.uuid4().hex[:6]}"
    inbox: queue.Queue[Message] = queue.Queue()
    transport = MqttTransport(url, f"tp-{device_id}", inbox=inbox)
    transport.connect()
    fetcher = ChunkFetcher(transport, device_id, 1.0, 120.0)
    first: list[float] = []

    def handle(message: Message) -> None:  # the agent's message loop: chunks go to the fetcher
        if message.topic.startswith(f"{topics.ROOT}/artifacts/"):
            artifact_id, index = topics.parse_artifact_chunk(message.topic)
            if not first:
                first.append(time.perf_counter())
            fetcher.feed(artifact_id, index, message.payload)

    pump = InboxPump(inbox, handle, "bench-agent-pump")
    download = kind(work / device_id, package.manifest.payload)
    ctl.server.expect(package.manifest.artifact_id, [device_id])  # as a deployment does for its devices
    try:
        cpu, start = time.process_time(), time.perf_counter()
        fetcher.fetch(download)
        elapsed, used = time.perf_counter() - start, time.process_time() - cpu
    finally:
        pump.close()
        transport.close()
    assert download.done_path.stat().st_size == package.manifest.payload.size
    download.discard()
    return elapsed, first[0] - start, used, download.finish_s if isinstance(download, Timed) else 0.0


def _raw_client(name: str, port: int, on_message: Callable[[Any, Any, mqtt.MQTTMessage], None] | None = None) -> mqtt.Client:
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=name, protocol=mqtt.MQTTv5)
    client.max_inflight_messages_set(64)  # same as MqttTransport's default
    if on_message is not None:
        client.on_message = on_message
    client.connect("127.0.0.1", port)
    client.loop_start()
    return client


def raw_paho_transfer(port: int, payload: Path, chunk_size: int, count: int, subscribers: int = 1) -> tuple[float, float]:
    """(wall, CPU of this process) seconds for a plain paho QoS 1 publisher -> ``subscribers`` subscribers.

    The subscribers are threads of this process and keep the chunks in memory."""
    topic = f"bench/raw/{uuid.uuid4().hex[:8]}"
    got = [0] * subscribers
    finished = threading.Semaphore(0)
    subscribed = threading.Semaphore(0)

    def receiver(k: int) -> Callable[[Any, Any, mqtt.MQTTMessage], None]:
        def on_message(_c: Any, _u: Any, _msg: mqtt.MQTTMessage) -> None:
            got[k] += 1
            if got[k] == count:
                finished.release()
        return on_message

    subs = [_raw_client(f"raw-sub-{topic[-8:]}-{k}", port, receiver(k)) for k in range(subscribers)]
    for sub in subs:
        sub.on_subscribe = lambda *_a: subscribed.release()
        sub.subscribe(f"{topic}/+", qos=1)
    pub = _raw_client(f"raw-pub-{topic[-8:]}", port)
    for _ in subs:
        assert subscribed.acquire(timeout=10), "raw subscriber got no SUBACK"
    try:
        cpu, start = time.process_time(), time.perf_counter()
        with payload.open("rb") as f:  # read like the server does, chunk by chunk
            for index in range(count):
                f.seek(index * chunk_size)
                pub.publish(f"{topic}/{index}", f.read(chunk_size), qos=1)
        for _ in subs:
            assert finished.acquire(timeout=120), f"raw paho: only {min(got)} of {count} chunks arrived"
        return time.perf_counter() - start, time.process_time() - cpu
    finally:
        for client in (pub, *subs):
            client.disconnect()
            client.loop_stop()


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def run(size_mb: float, agents: int, parts: tuple[str, ...], http_mb: int, baseline: Baseline | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-delivery-") as tmp:
        work = Path(tmp)
        os.environ["EDGECTL_HOME"] = str(work / "home")
        (work / "home").mkdir()
        result: dict[str, Any] = {"parts": parts, "baseline": baseline.ref if baseline else None}
        if "waves" in parts or "throughput" in parts:
            broker = start_mosquitto(work / "broker")
            try:
                assert broker.process is not None
                result |= _measure(broker.url, broker.port, psutil.Process(broker.process.pid), work, size_mb, agents, parts,
                                   baseline)
            finally:
                broker.stop()
        if "http" in parts:
            print(f"http: the agent's Range download against curl, {http_mb} MiB, interleaved ...", flush=True)
            result["http"] = measure_http(http_mb, 64, 9, baseline)
        result["load"] = os.getloadavg()
        return result


def _measure(url: str, port: int, broker: psutil.Process, work: Path, size_mb: float, agents: int,
             parts: tuple[str, ...], baseline: Baseline | None) -> dict[str, Any]:
    ring = Keyring(root=work / "home" / "keys")
    ring.init("package")
    ring.init("controller")
    model = big_model(work / "big.onnx", size_mb)
    pkg_path = work / "big.edgepkg"
    build_package(model, BuildOptions("big", 1), ring.signing_key("package"), pkg_path)
    (work / "unpacked").mkdir()
    package = read_package(pkg_path, TrustedKeys([ring.signing_key("package").public_key()]), work / "unpacked")
    info = package.manifest.payload
    print(f"package: {info.size / 1e6:.2f} MB payload, {len(info.chunks)} chunks of {info.chunk_size} B", flush=True)
    result: dict[str, Any] = {"size": info.size, "chunk_size": info.chunk_size, "chunks": len(info.chunks), "agents": agents}
    if "throughput" in parts:
        result |= _throughput(url, port, broker, package, work, baseline)
    if "waves" in parts:
        result |= _waves(url, port, broker, package, ring, work, agents)
    return result


def _throughput(url: str, port: int, broker: psutil.Process, package: Package, work: Path,
                baseline: Baseline | None) -> dict[str, Any]:
    info = package.manifest.payload
    print(f"throughput: agent path vs raw paho, and the agent path unchecked, interleaved, {REPEATS} times ...", flush=True)

    def with_broker(run: Callable[[], tuple[float, ...]]) -> tuple[float, ...]:
        """``run``'s figures, and Mosquitto's CPU seconds during it."""
        cpu = sum(broker.cpu_times()[:2])
        return (*run(), sum(broker.cpu_times()[:2]) - cpu)

    ctl = BenchController(url, package)
    agent, unchecked, raw, before = [], [], [], []
    try:
        for _ in range(REPEATS):
            agent.append(with_broker(functools.partial(agent_path_transfer, url, ctl, package, work / "tp")))
            raw.append(with_broker(functools.partial(raw_paho_transfer, port, package.payload, info.chunk_size,
                                                     len(info.chunks))))
            unchecked.append(with_broker(functools.partial(agent_path_transfer, url, ctl, package, work / "tp", Unchecked)))
            if baseline is not None:
                before.append(agent_path_transfer(url, ctl, package, work / "tp", baseline.download))
    finally:
        ctl.close()

    def median(runs: Sequence[tuple[float, ...]], k: int) -> float:
        return statistics.median(r[k] for r in runs)

    return {"agent_s": median(agent, 0), "first_s": median(agent, 1), "agent_cpu": median(agent, 2),
            "raw_s": median(raw, 0), "raw_cpu": median(raw, 1), "unchecked_s": median(unchecked, 0),
            "unchecked_cpu": median(unchecked, 2) + median(unchecked, 4), "agent_finish": median(agent, 3),
            "agent_broker_cpu": median(agent, 4), "raw_broker_cpu": median(raw, 2),
            "duties": median_duties(package.payload, info.chunk_size), "before_s": median(before, 0) if before else None,
            "agent_all": [r[0] for r in agent], "raw_all": [r[0] for r in raw]}


def _waves(url: str, port: int, broker: psutil.Process, package: Package, ring: Keyring, work: Path,
           agents: int) -> dict[str, Any]:
    info = package.manifest.payload
    print(f"raw paho fan-out: 1 and {agents} subscribers in this process ...", flush=True)
    raw_one = raw_paho_transfer(port, package.payload, info.chunk_size, len(info.chunks))[0]
    raw_many = raw_paho_transfer(port, package.payload, info.chunk_size, len(info.chunks), agents)[0]
    fleet = SimFleet(url, TrustedKeys([ring.signing_key("package").public_key()]),
                     TrustedKeys([ring.signing_key("controller").public_key()]))
    try:
        print("wave of 1 ...", flush=True)
        one = wave(url, fleet, ring, package, work, "one", 1, broker)
        print(f"wave of {agents} ...", flush=True)
        many = wave(url, fleet, ring, package, work, "many", agents, broker)
    finally:
        fleet.stop()
    return {"one": one, "many": many, "raw_one": raw_one, "raw_many": raw_many}


def _cpu_line(w: dict[str, Any], devices: int) -> str:
    cpu = w["cpu"]
    total = cpu["devices"] + cpu["controller"] + cpu["broker"]
    return (f"{w['seconds']:.2f} s wall: light agents {cpu['devices']:.2f} CPU-s ({1000 * cpu['devices'] / devices:.0f} ms per"
            f" device), controller {cpu['controller']:.2f}, Mosquitto {cpu['broker']:.2f}; {total / w['seconds']:.2f} of"
            f" {os.cpu_count()} cores busy on average")


def report(r: dict[str, Any], command: str) -> str:
    parts = r["parts"]
    lines = [f"Machine: {machine()}. Command: `{command}`."]
    if "size" in r:
        lines.append(f"Package: {r['size'] / 1e6:.2f} MB payload ({r['chunks']} chunks of {r['chunk_size'] // 1024} KiB),"
                     " random-weight MatMul model.")
    lines += ["", "| measurement | value | ratio | goal | result |", "|---|---|---|---|---|"]
    if "waves" in parts:
        lines += _wave_rows(r)
    if "throughput" in parts:
        lines += _throughput_rows(r)
    if "http" in parts:
        lines += _http_rows(r["http"], r["baseline"])
    if "throughput" in parts or "http" in parts:
        lines += ["", "What bounds the two throughput ratios (measured in the same run; load average"
                  f" {r['load'][0]:.1f} at its end on {os.cpu_count()} cores):", ""]
        if "throughput" in parts:
            lines.append(_mqtt_bound(r))
        if "http" in parts:
            lines.append(_http_bound(r["http"]))
    if "waves" in parts:
        lines += ["", *_wave_text(r)]
    if "throughput" in parts:
        lines += ["", "All runs (s): agent path " + ", ".join(f"{s:.3f}" for s in r["agent_all"])
                  + "; raw paho " + ", ".join(f"{s:.3f}" for s in r["raw_all"]) + "."]
    if "http" in parts:
        h = r["http"]
        lines += ["", "All HTTP runs (s): curl " + ", ".join(f"{s:.3f}" for s in h["curl_all"])
                  + "; agent " + ", ".join(f"{s:.3f}" for s in h["agent_all"]) + "."]
    if "throughput" in parts or "waves" in parts:
        lines += ["", PATH]
    if "http" in parts:
        lines += ["", HTTP_PATH]
    return "\n".join(lines)


def _wave_rows(r: dict[str, Any]) -> list[str]:
    n, one, many = r["agents"], r["one"], r["many"]
    fan, raw_fan = many["seconds"] / one["seconds"], r["raw_many"] / r["raw_one"]
    bytes_ratio, bytes_one = many["bytes"] / r["size"], one["bytes"] / r["size"]
    return [
        f"| deploy to 1 light agent (`deploy_to_devices`: desired publish -> done ok) | {one['seconds']:.2f} s | | | |",
        f"| deploy to {n} light agents (desired publish -> all done ok) | {many['seconds']:.2f} s"
        f" | time({n})/time(1) = {fan:.2f} | < {FANOUT_GOAL} | {verdict(fan < FANOUT_GOAL)} |",
        f"| same chunks, raw paho QoS 1 to 1 and to {n} subscribers in this process (memory only: the harness's floor)"
        f" | {r['raw_one']:.3f} s, {r['raw_many']:.2f} s | time({n})/time(1) = {raw_fan:.1f} | (diagnostic) | |",
        f"| controller bytes sent, wave of 1 | {one['bytes'] / 1e6:.2f} MB ({one['chunks']} chunks)"
        f" | {bytes_one:.2f} x payload | | |",
        f"| controller bytes sent, wave of {n} | {many['bytes'] / 1e6:.2f} MB ({many['chunks']} chunks, {many['requests']}"
        f" requests) | {bytes_ratio:.2f} x payload | <= {BYTES_GOAL} | {verdict(bytes_ratio <= BYTES_GOAL)} |",
    ]


def _throughput_rows(r: dict[str, Any]) -> list[str]:
    mb = r["size"] / 1e6
    raw_mbs, agent_mbs, unchecked_mbs = mb / r["raw_s"], mb / r["agent_s"], mb / r["unchecked_s"]
    tp = agent_mbs / raw_mbs
    steady = mb / max(r["agent_s"] - r["first_s"], 1e-6)
    return [
        f"| raw paho QoS 1 pub -> sub, same chunks, same broker (median of {REPEATS}) | {raw_mbs:.1f} MB/s"
        f" ({r['raw_s']:.3f} s) | | | |",
        f"| agent path: ArtifactServer -> broker -> ChunkFetcher/Download to disk (median of {REPEATS}) | {agent_mbs:.1f} MB/s"
        f" ({r['agent_s']:.3f} s) | agent/raw = {tp:.2f} | >= {THROUGHPUT_GOAL} | {verdict(tp >= THROUGHPUT_GOAL)} |",
        f"| agent path after its first chunk arrived (first chunk after {1000 * r['first_s']:.0f} ms)"
        f" | {steady:.1f} MB/s | agent/raw = {steady / raw_mbs:.2f} | (diagnostic) | |",
        f"| agent path into a download that neither hashes nor writes (median of {REPEATS}) | {unchecked_mbs:.1f} MB/s"
        f" ({r['unchecked_s']:.3f} s) | agent/raw = {unchecked_mbs / raw_mbs:.2f} | (diagnostic) | |",
    ] + ([] if r["before_s"] is None else [
        f"| agent path, `Download` as at {r['baseline']} (before; median of {REPEATS}) | {mb / r['before_s']:.1f} MB/s"
        f" ({r['before_s']:.3f} s) | agent/raw = {r['raw_s'] / r['before_s']:.2f} | (baseline) | |"])


def _http_rows(h: dict[str, Any], baseline: str | None) -> list[str]:
    mb, runs = h["size"] / 1e6, h["runs"]
    ratio = h["median_ratio"]
    return [
        f"| curl, same {mb:.0f} MB file from `edgectl artifacts serve` (median of {runs}) | {mb / h['curl_median']:.0f} MB/s"
        f" ({h['curl_median']:.3f} s) | | | |",
        f"| agent HttpFetch ({h['chunk_kib']} KiB chunks: Range, sha256 each, pwrite, fsync; median of {runs})"
        f" | {mb / h['agent_median']:.0f} MB/s ({h['agent_median']:.3f} s) | agent/curl = {ratio:.2f}"
        f" | >= {HTTP_GOAL} | {verdict(ratio >= HTTP_GOAL)} |",
        f"| agent HttpFetch into a download that neither hashes nor writes (median of {runs})"
        f" | {mb / h['unchecked_median']:.0f} MB/s ({h['unchecked_median']:.3f} s)"
        f" | agent/curl = {h['curl_median'] / h['unchecked_median']:.2f} | (diagnostic) | |",
    ] + ([] if h["before_median"] is None else [
        f"| agent HttpFetch and `Download` as at {baseline} (before; median of {runs}) | {mb / h['before_median']:.0f} MB/s"
        f" ({h['before_median']:.3f} s) | agent/curl = {h['curl_median'] / h['before_median']:.2f} | (baseline) | |"])


def _mqtt_bound(r: dict[str, Any]) -> str:
    d, mb, cores = r["duties"], r["size"] / 1e6, os.cpu_count() or 1
    serial = r["unchecked_s"] + d["sha256"] + d["write"] + r["agent_finish"]
    raw_cpu, agent_cpu = r["raw_cpu"] + r["raw_broker_cpu"], r["agent_cpu"] + r["agent_broker_cpu"]
    return (f"- MQTT: into a download that neither hashes nor writes, the agent path reaches"
            f" {r['raw_s'] / r['unchecked_s']:.2f} of raw paho: what stands between it and the goal is what only the agent"
            f" does, which the raw subscriber (chunks kept in memory) does not. Measured alone on this payload: sha256 of"
            f" its {r['chunks']} chunks {1000 * d['sha256']:.1f} ms CPU ({1000 * d['sha256'] / mb:.2f} ms/MB), their"
            f" positioned writes {1000 * d['write']:.1f} ms CPU, one fsync of the whole file {1000 * d['fsync']:.1f} ms, of"
            f" which the background flush leaves the agent's final fsync {1000 * r['agent_finish']:.1f} ms (median). CPU"
            f" per transfer, this process (publisher, broker clients, agent) and Mosquitto together: raw"
            f" {1000 * raw_cpu:.0f} ms, unchecked agent {1000 * r['unchecked_cpu']:.0f} ms, agent"
            f" {1000 * agent_cpu:.0f} ms; spread on {cores} cores the agent's could take {1000 * agent_cpu / cores:.0f} ms,"
            f" so the cores are not what binds it. The order is: unchecked path + sha256 + writes + final fsync, one after"
            f" the other, take {1000 * serial:.0f} ms, agent/raw {r['raw_s'] / serial:.2f}, against"
            f" {r['raw_s'] / r['agent_s']:.2f} measured: the check and the write run on the agent's message-loop thread, in"
            f" line with the chunks' Python handling in this one interpreter, and overlap little.")


def _http_bound(h: dict[str, Any]) -> str:
    d, mb, cores = h["duties"], h["size"] / 1e6, os.cpu_count() or 1
    checker = d["sha256"] + d["write"] + h["agent_finish"]
    serial = h["unchecked_median"] + checker
    curl_all, agent_all = h["curl_cpu"] + h["curl_server_cpu"], h["agent_cpu"] + h["agent_server_cpu"]
    return (f"- HTTP: the agent's client alone (Range requests on one kept-alive connection, read straight into 1 MiB"
            f" blocks, nothing hashed or written) reaches {h['curl_median'] / h['unchecked_median']:.2f} of curl, which"
            f" writes the file. CPU per MB: curl {1000 * h['curl_cpu'] / mb:.2f} ms (its whole process, writes included),"
            f" the agent {1000 * h['agent_cpu'] / mb:.2f} ms ({1000 * h['unchecked_cpu'] / mb:.2f} ms hashing and writing"
            f" nothing); sha256 of every chunk alone costs {1000 * d['sha256'] / mb:.2f} ms/MB,"
            f" {d['sha256'] / h['curl_cpu']:.0%} of what curl's whole download costs, and the writes"
            f" {1000 * d['write'] / mb:.2f} ms/MB; the final fsync took {1000 * h['agent_finish']:.1f} ms (median; one"
            f" fsync of the whole file alone: {1000 * d['fsync']:.1f} ms). With the server, one run used"
            f" {1000 * curl_all:.0f} ms CPU for curl and {1000 * agent_all:.0f} ms for the agent: on {cores} cores the"
            f" agent's run cannot take less than {1000 * agent_all / cores:.0f} ms, agent/curl at most"
            f" {h['curl_median'] * cores / agent_all:.2f}. The reading overlaps the checking: one thread reads while a"
            f" second hashes and writes. That second thread alone needs sha256 + writes + the final fsync ="
            f" {1000 * checker:.0f} ms for the file, against {1000 * h['curl_median']:.0f} ms for curl's whole download:"
            f" however well it overlaps, agent/curl cannot pass {h['curl_median'] / checker:.2f} here. One after the other,"
            f" unchecked client + that work would take {1000 * serial:.0f} ms, agent/curl {h['curl_median'] / serial:.2f};"
            f" measured {h['median_ratio']:.2f}.")


def _wave_text(r: dict[str, Any]) -> list[str]:
    n, one, many = r["agents"], r["one"], r["many"]
    cores = os.cpu_count() or 1
    raw_fan = r["raw_many"] / r["raw_one"]
    bytes_ratio = many["bytes"] / r["size"]
    # The least wall time the N-device wave could take here: N times what one device's work cost alone, spread on every core.
    floor = n * one["cpu"]["devices"] / cores
    return [
        f"CPU during the wave of 1: {_cpu_line(one, 1)}. During the wave of {n}: {_cpu_line(many, n)}."
        f" First chunk published {1000 * one['first_chunk']:.0f} ms (wave of 1) and {1000 * many['first_chunk']:.0f} ms"
        f" (wave of {n}) after the first desired state.",
        "",
        f"Why the fan-out ratio is out of reach on this machine: all {n} light agents run in this one Python process on"
        f" {cores} cores, and each must receive, hash and write the whole payload and then extract it. One device alone"
        f" used {one['cpu']['devices']:.2f} CPU-s, so {n} of them cannot finish in less than {floor:.2f} s"
        f" ({floor / one['seconds']:.1f} x the wave of 1) even with every core working for them and nothing else; they"
        f" share one interpreter lock, and raw paho alone, to {n} subscribers in one process, already takes"
        f" {raw_fan:.0f} x its time to 1. The goal is about real devices, each with its own CPU. The part of the wave that"
        f" is the controller's and the broker's scales as it should: one publication of every chunk"
        f" ({bytes_ratio:.2f} x payload for {n} devices), controller {many['cpu']['controller']:.2f} CPU-s for {n} devices"
        f" against {one['cpu']['controller']:.2f} for 1, Mosquitto {many['cpu']['broker']:.2f} against"
        f" {one['cpu']['broker']:.2f}.",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=10.0, help="model size in MiB (default 10)")
    parser.add_argument("--agents", type=int, default=50, help="light agents in the fan-out wave (default 50)")
    parser.add_argument("--http-mb", type=int, default=64, help="file size for the agent's HTTP download vs curl (default 64)")
    parser.add_argument("--parts", default=",".join(PARTS),
                        help=f"comma-separated, of {', '.join(PARTS)} (default all; only all write docs/benchmarks.md)")
    parser.add_argument("--baseline", metavar="REF", help="also measure the agent's download code (edgecore/delivery/"
                        "download.py, http_fetch.py) as at this git ref, interleaved: before and after in one run")
    parser.add_argument("--no-docs", action="store_true", help="do not write the figures into docs/benchmarks.md")
    args = parser.parse_args()
    parts = tuple(p for p in PARTS if p in args.parts.split(","))
    if unknown := set(args.parts.split(",")) - set(PARTS):
        parser.error(f"unknown part(s) {', '.join(sorted(unknown))}: use {', '.join(PARTS)}")
    command = COMMAND + "".join(f" --{k.replace('_', '-')} {v}" for k, v in
                                (("size_mb", args.size_mb), ("agents", args.agents), ("http_mb", args.http_mb),
                                 ("parts", args.parts), ("baseline", args.baseline)) if v != parser.get_default(k))
    began = time.monotonic()
    baseline = Baseline.load(args.baseline) if args.baseline else None
    body = report(run(args.size_mb, args.agents, parts, args.http_mb, baseline), command)
    print()
    print(body)
    print(f"\nwall time {time.monotonic() - began:.0f} s; rerun: {command}")
    if not args.no_docs and parts == PARTS:
        print(f"figures written to {write_section('delivery', command, body).relative_to(ROOT)} (## delivery)")


if __name__ == "__main__":
    main()
