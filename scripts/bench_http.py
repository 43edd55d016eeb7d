#!/usr/bin/env python3
"""The agent's HTTP chunk download against curl, both fetching the same file from the same server.

    .venv/bin/python scripts/bench_http.py [--mb 64] [--chunk-kib 64] [--runs 9]

``edgectl artifacts serve`` runs in its own process. The agent's side is the code a device runs
(edgecore.delivery.http_fetch.HttpFetch filling a Download: Range requests, sha256 of every chunk,
positioned writes into the .part file, fsync and rename); curl writes the same bytes to a file.
The runs are interleaved (curl, agent, the agent's diagnostic run) so that a busy moment on a
shared machine hits them alike; the figures are medians, the goal a ratio of at least 0.8. Beside
them: the CPU seconds each side used, what sha256 of every chunk costs alone, and the agent's
fetch into a download that takes the chunks without checking or writing them (what the HTTP
client itself costs). ``./scripts/bench delivery`` prints these in its section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edgecore.delivery.download import Download
from edgecore.delivery.http_fetch import HttpFetch, HttpSettings
from edgecore.protocol.chunks import chunk_digests
from edgecore.protocol.manifest import PayloadInfo

__all__ = ["GOAL", "Baseline", "Unchecked", "duties", "measure", "median_duties"]

GOAL = 0.8
ROOT = Path(__file__).resolve().parent.parent


class Unchecked(Download):
    """A download that counts chunks as arrived without hashing or writing them: a diagnostic, never a device's."""

    def accept(self, index: int, data: bytes) -> bool:
        if index in self.have:
            return False
        self.have.add(index)
        return True

    def accept_run(self, first: int, data: bytes | bytearray | memoryview) -> int | None:
        self.have.update(range(first, first + -(-len(data) // self.payload.chunk_size)))
        return None


def duties(path: Path, chunk: int) -> dict[str, float]:
    """What only the agent does to a payload, measured alone: sha256 of every chunk (CPU s), writing every chunk
    at its offset into a preallocated file (CPU s) and one fsync of that file after it (wall s)."""
    data = memoryview(path.read_bytes())
    cpu = time.process_time()
    for offset in range(0, len(data), chunk):
        hashlib.sha256(data[offset:offset + chunk]).hexdigest()
    sha = time.process_time() - cpu
    copy = path.with_name(path.name + ".duties")
    with copy.open("wb") as f:
        f.truncate(len(data))
    fd = os.open(copy, os.O_RDWR)
    try:
        cpu = time.process_time()
        for offset in range(0, len(data), chunk):
            os.pwrite(fd, data[offset:offset + chunk], offset)
        write = time.process_time() - cpu
        start = time.perf_counter()
        os.fsync(fd)
        sync = time.perf_counter() - start
    finally:
        os.close(fd)
        copy.unlink()
    return {"sha256": sha, "write": write, "fsync": sync}


def median_duties(path: Path, chunk: int, runs: int = 3) -> dict[str, float]:
    measured = [duties(path, chunk) for _ in range(runs)]
    return {k: statistics.median(d[k] for d in measured) for k in measured[0]}


def _serve(directory: Path) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen([sys.executable, "-m", "edgectl.cli.main", "artifacts", "serve", str(directory), "--port", "0"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert process.stdout is not None
    match = re.search(r"on (http://\S+?)/?$", process.stdout.readline().strip())
    if match is None:
        process.kill()
        raise SystemExit("edgectl artifacts serve did not start")
    return process, match[1]


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _curl(url: str, out: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of one curl download to a file."""
    cpu, start = _children_cpu(), time.perf_counter()
    subprocess.run(["curl", "-sS", "--fail", "-o", str(out), url], check=True)
    took = time.perf_counter() - start
    out.unlink()
    return took, _children_cpu() - cpu


@dataclass(frozen=True)
class Baseline:
    """edgecore/delivery/download.py and http_fetch.py as they were at a git ref, loaded beside the working tree's
    (read with ``git show``; the other modules they import are the working tree's): the code before a change,
    measured in the same run as the code after it."""

    ref: str
    download: type[Any]  # its Download
    fetch: type[Any]  # its HttpFetch

    @classmethod
    def load(cls, ref: str) -> Baseline:
        modules: dict[str, types.ModuleType] = {}
        for name in ("download", "http_fetch"):
            source = subprocess.run(["git", "show", f"{ref}:edgecore/delivery/{name}.py"], cwd=ROOT, capture_output=True,
                                    text=True, check=True).stdout
            source = source.replace("from edgecore.delivery.download import", "from edgecore_baseline_download import")
            module = types.ModuleType(f"edgecore_baseline_{name}")
            sys.modules[module.__name__] = module  # before it runs: its dataclasses look themselves up there
            exec(compile(source, f"{ref}:edgecore/delivery/{name}.py", "exec"), module.__dict__)
            modules[name] = module
        return cls(ref, modules["download"].Download, modules["http_fetch"].HttpFetch)


def _agent(url: str, payload: PayloadInfo, workdir: Path, kind: type[Download] = Download,
           fetcher: type[Any] = HttpFetch) -> tuple[float, float, float]:
    """(wall, CPU of this process, finish) seconds of one fetch into a fresh download; finish: its fsync and rename."""
    cpu, start = time.process_time(), time.perf_counter()
    download = kind(workdir, payload)
    fetch = fetcher(HttpSettings())
    if not fetch.fetch(download, [url]):
        raise SystemExit(f"the agent's fetch did not complete: {len(download.have)} of {len(payload.chunks)} chunks")
    fetched = time.perf_counter()
    download.finish()
    took, used = time.perf_counter() - start, time.process_time() - cpu
    shutil.rmtree(workdir)
    return took, used, start + took - fetched


def measure(mb: int = 64, chunk_kib: int = 64, runs: int = 9, baseline: Baseline | None = None) -> dict[str, Any]:
    """curl, the agent, the agent into an :class:`Unchecked` download (and ``baseline``'s agent), ``runs`` times
    each, interleaved.

    ``curl_s``, ``agent_s`` and ``ratio`` are the best runs (as ``./scripts/bench fleet`` reports them);
    the ``*_median`` figures and ``median_ratio`` are the medians."""
    if shutil.which("curl") is None:
        raise SystemExit("curl is not installed: apt-get install curl")
    with tempfile.TemporaryDirectory(prefix="bench-http-") as tmp:
        root = Path(tmp) / "served"
        root.mkdir()
        source = root / "payload"
        with source.open("wb") as f:
            for _ in range(mb):
                f.write(os.urandom(1 << 20))
        size, chunk = source.stat().st_size, chunk_kib * 1024
        whole, chunks = chunk_digests(source, chunk)
        payload = PayloadInfo(size, whole, chunk, tuple(chunks))
        server, base = _serve(root)
        url = f"{base}/payload"
        served = psutil.Process(server.pid)

        def with_server(run: Callable[[], tuple[float, ...]]) -> tuple[float, ...]:
            """``run``'s figures, and the server's CPU seconds during it."""
            cpu = sum(served.cpu_times()[:2])
            return (*run(), sum(served.cpu_times()[:2]) - cpu)

        curl, agent, unchecked, before = [], [], [], []
        try:
            for i in range(runs):  # interleaved, so a busy moment on a shared machine hits all of them
                curl.append(with_server(functools.partial(_curl, url, Path(tmp) / "curl.out")))
                agent.append(with_server(functools.partial(_agent, url, payload, Path(tmp) / f"agent-{i}")))
                unchecked.append(_agent(url, payload, Path(tmp) / f"unchecked-{i}", Unchecked))
                if baseline is not None:
                    before.append(_agent(url, payload, Path(tmp) / f"before-{i}", baseline.download, baseline.fetch))
        finally:
            server.terminate()
            server.wait(10)
        duty = median_duties(source, chunk)

    def median(runs: Sequence[tuple[float, ...]], k: int) -> float:
        return statistics.median(r[k] for r in runs)

    curl_s, agent_s = min(r[0] for r in curl), min(r[0] for r in agent)
    return {"size": size, "chunks": len(chunks), "chunk_kib": chunk_kib, "runs": runs, "curl_s": curl_s, "agent_s": agent_s,
            "ratio": curl_s / agent_s, "curl_median": median(curl, 0), "agent_median": median(agent, 0),
            "median_ratio": median(curl, 0) / median(agent, 0), "unchecked_median": median(unchecked, 0),
            "curl_cpu": median(curl, 1), "agent_cpu": median(agent, 1), "unchecked_cpu": median(unchecked, 1),
            "agent_finish": median(agent, 2), "curl_server_cpu": median(curl, 2), "agent_server_cpu": median(agent, 3),
            "duties": duty, "curl_all": [r[0] for r in curl],
            "agent_all": [r[0] for r in agent], "before_median": median(before, 0) if before else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=64, help="payload size in MiB (default 64)")
    parser.add_argument("--chunk-kib", type=int, default=64, help="signed chunk size in KiB (default 64, as packages)")
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--baseline", metavar="REF", help="also measure the agent's code at this git ref, interleaved")
    args = parser.parse_args()
    got = measure(args.mb, args.chunk_kib, args.runs, Baseline.load(args.baseline) if args.baseline else None)
    mb = got["size"] / 1e6
    print(f"payload {mb:.1f} MB in {got['chunks']} chunks of {args.chunk_kib} KiB, medians of {args.runs} runs, loopback")
    print(f"curl:  {got['curl_median']:.3f} s  {mb / got['curl_median']:8.1f} MB/s, {got['curl_cpu']:.3f} CPU-s")
    print(f"agent: {got['agent_median']:.3f} s  {mb / got['agent_median']:8.1f} MB/s, {got['agent_cpu']:.3f} CPU-s"
          "  (Range requests, sha256 per chunk, pwrite, fsync)")
    print(f"agent, chunks neither hashed nor written (diagnostic): {got['unchecked_median']:.3f} s,"
          f" {got['unchecked_cpu']:.3f} CPU-s; sha256 of every chunk alone: {got['duties']['sha256']:.3f} CPU-s")
    ratio = got["median_ratio"]
    print(f"agent/curl throughput: {ratio:.2f} (goal >= {GOAL}: {'met' if ratio >= GOAL else 'NOT met'});"
          f" best runs: {got['ratio']:.2f}")
    if got["before_median"] is not None:
        before = got["before_median"]
        print(f"agent at {args.baseline}: {before:.3f} s, agent/curl {got['curl_median'] / before:.2f}")
    print(f"rerun: .venv/bin/python scripts/bench_http.py --mb {args.mb} --chunk-kib {args.chunk_kib} --runs {args.runs}"
          + (f" --baseline {args.baseline}" if args.baseline else ""))


if __name__ == "__main__":
    main()
